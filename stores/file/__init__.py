"""The file store: ``_store`` (the store), ``_io`` (appends, locks, the head hint and
the layout of a run's folder), ``_log`` (where the committed part of a log ends) and
``_doctor`` (its checks)."""

from statekernel.stores.file._store import FileStore

__all__ = ["FileStore"]
