"""The file store: ``_store`` (the store), ``_io`` (atomic writes, locks and the
layout of a run's folder) and ``_doctor`` (its checks)."""

from statekernel.stores.file._store import FileStore

__all__ = ["FileStore"]
