"""``open_store(url)``: pick a store implementation by URL scheme."""

from __future__ import annotations

from statekernel._secrets import redact_url, remember_url
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import ConfigError

__all__ = ["open_store"]


def open_store(url: str) -> CheckpointStore:
    """The store for ``url``; an unknown scheme or malformed URL raises ``ConfigError``.

    Opening is lazy: connections and files are opened on first use.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"not a store URL: {redact_url(str(url))!r} (expected scheme://...)")
    remember_url(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        from statekernel.stores._memory import MemoryStore

        return MemoryStore(url.split("://", 1)[1])
    if scheme == "sqlite":
        from statekernel.stores.sqlite._store import SQLiteStore

        return SQLiteStore(url)
    if scheme == "file":
        from statekernel.stores.file._store import FileStore

        return FileStore(url)
    if scheme in ("redis", "rediss"):
        from statekernel.stores.redis._store import RedisStore

        return RedisStore(url)
    if scheme in ("postgresql", "postgres"):
        try:
            from statekernel.stores.postgres import PostgresStore
        except ImportError as exc:  # the driver is an extra
            raise ConfigError(
                f"{redact_url(url)!r} needs asyncpg: pip install 'statekernel[postgres]'"
            ) from exc

        return PostgresStore(url)
    raise ConfigError(
        f"unknown store URL scheme {scheme!r} in {redact_url(url)!r} "
        "(known: memory, file, sqlite, redis, rediss, postgresql, postgres)"
    )
