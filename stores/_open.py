"""``open_store(url)``: pick a store implementation by URL scheme; ``backend`` finds a
part of the backend a URL names (its store, its doctor's probe) for both.

Schemes other than the built-in ones are looked up in the entry point group
``statekernel.stores`` (``statekernel._storage.plugins``): a store of another
distribution, whose doctor has no probe for it."""

from __future__ import annotations

import importlib
from typing import Any

from statekernel._secrets import redact_url, remember_url
from statekernel._storage.plugins import (
    STORE_GROUP,
    load_registered,
    make_registered,
    registered,
)
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import ConfigError

__all__ = ["backend", "open_store", "open_store_to_read", "queue_schemes"]

_BACKENDS: dict[str, str] = {
    "memory": "memory",
    "sqlite": "sqlite",
    "file": "file",
    "redis": "redis",
    "rediss": "redis",
    "postgresql": "postgres",
    "postgres": "postgres",
}
"""URL scheme -> backend."""

_QUEUES = frozenset({"redis", "postgres"})
"""The built-in backends whose stores have run queues (``RunQueues``)."""


def queue_schemes() -> str:
    """The URL schemes of the built-in stores with run queues, as a message names them
    (``redis://, rediss:// or postgresql://``)."""
    schemes = [f"{s}://" for s, b in _BACKENDS.items() if b in _QUEUES and s != "postgres"]
    return ", ".join(schemes[:-1]) + " or " + schemes[-1]


_PARTS: dict[str, dict[str, tuple[str, str]]] = {
    "store": {
        "memory": ("statekernel.stores._open", "_memory_store"),
        "sqlite": ("statekernel.stores.sqlite._store", "SQLiteStore"),
        "file": ("statekernel.stores.file._store", "FileStore"),
        "redis": ("statekernel.stores.redis._store", "RedisStore"),
        "postgres": ("statekernel.stores.postgres._store", "PostgresStore"),
    },
    "probe": {
        "memory": ("statekernel.stores.memory._doctor", "MemoryProbe"),
        "sqlite": ("statekernel.stores.sqlite._doctor", "SQLiteProbe"),
        "file": ("statekernel.stores.file._doctor", "FileProbe"),
        "redis": ("statekernel.stores.redis._doctor", "RedisProbe"),
        "postgres": ("statekernel.stores.postgres._doctor", "PostgresProbe"),
    },
}


def backend(url: object, part: str) -> Any:
    """What makes ``part`` (``store`` or ``probe``) of the backend ``url`` names,
    called with the URL. A malformed URL, an unknown scheme, or a backend whose driver
    (an extra) is missing is a ``ConfigError``."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"not a store URL: {redact_url(str(url))!r} (expected scheme://...)")
    scheme = url.split("://", 1)[0].lower()
    name = _BACKENDS.get(scheme)
    if name is None:
        return _registered(url, scheme, part)
    module, cls = _PARTS[part][name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        if name != "postgres":
            raise
        raise ConfigError(  # its driver is an extra
            f"{redact_url(url)!r} needs asyncpg: pip install 'statekernel[postgres]'"
        ) from exc


def open_store(url: str) -> CheckpointStore:
    """The store for ``url``; an unknown scheme or malformed URL raises ``ConfigError``.

    Opening is lazy: connections and files are opened on first use.

    Returns:
        The store (not yet connected).

    Raises:
        ConfigError: the URL's scheme is unknown, the URL or one of its options is
            malformed, the backend's driver is not installed (``postgresql://`` needs
            the ``postgres`` extra), or a registered store factory fails.
    """
    make = backend(url, "store")
    remember_url(url)
    store: CheckpointStore = make(url)
    return store


def open_store_to_read(url: str) -> CheckpointStore:
    """The store for ``url`` for a reader (a view without an agent): a PostgreSQL store
    opens read-only, so it creates and upgrades no schema that writers of another
    release use, and refuses writes; other backends open as ``open_store`` does (a
    reader that must not create one checks that it exists first)."""
    make = backend(url, "store")
    remember_url(url)
    if _BACKENDS.get(url.split("://", 1)[0].lower()) == "postgres":
        store: CheckpointStore = make(url, read_only=True)
    else:
        store = make(url)
    return store


def _memory_store(url: str) -> CheckpointStore:
    """``memory://name``: a store in this process (its name is the rest of the URL)."""
    from statekernel.stores.memory._store import MemoryStore

    return MemoryStore(url.split("://", 1)[1])


def _registered(url: str, scheme: str, part: str) -> Any:
    """The store a distribution registered for ``scheme`` (entry point group
    ``statekernel.stores``); ``ConfigError`` when there is none, or for a doctor's probe."""
    found = load_registered(STORE_GROUP, scheme)
    if found is None:
        known = [*_BACKENDS, *sorted(registered(STORE_GROUP))]
        raise ConfigError(
            f"unknown store URL scheme {scheme!r} in {redact_url(url)!r} "
            f"(known: {', '.join(known)}; others register in the entry point group "
            f"{STORE_GROUP!r})"
        )
    if part != "store":
        raise ConfigError(f"statekernel doctor has no checks for {scheme}:// stores")
    if not callable(found):
        raise ConfigError(f"the {STORE_GROUP} entry point {scheme!r} is not callable: {found!r}")

    def make(url: str) -> CheckpointStore:
        store: CheckpointStore = make_registered(
            STORE_GROUP, scheme, found, (url,), CheckpointStore
        )
        return store

    return make
