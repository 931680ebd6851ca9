"""The Redis store: ``_store`` (the store and its scripts), ``_wire`` (the
connection), ``_replicas`` (what a write waits for: its replicas), ``_index``
(listings), ``_fencing`` (what workers need of it), ``_queue`` (run queues on Redis
Streams) and ``_doctor`` (its checks)."""

from statekernel.stores.redis import _live  # noqa: F401  (carries the runs' live events)
from statekernel.stores.redis._store import RedisStore

__all__ = ["RedisStore"]
