"""``memory://``: runs in this process, for tests and short-lived work (``_store``), and
what the doctor says of them (``_doctor``)."""

from statekernel.stores.memory._store import MemoryStore

__all__ = ["MemoryStore"]
