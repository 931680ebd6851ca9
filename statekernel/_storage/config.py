"""Where the default store comes from: environment, project configuration, built-in default."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from statekernel.errors import ConfigError

__all__ = ["DEFAULT_STORE_URL", "ENV_VAR", "default_store_url"]

ENV_VAR = "STATEKERNEL_STORE"
DEFAULT_STORE_URL = "sqlite:///.statekernel/runs.db"
"""The embedded default: a SQLite file under ``.statekernel/`` in the working directory."""

_KEYS = frozenset({"store"})
"""The keys statekernel reads from its config section."""

_FILES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("statekernel.toml", ()),
    ("pyproject.toml", ("tool", "statekernel")),
)


def default_store_url(
    *, environ: Mapping[str, str] | None = None, cwd: str | Path | None = None
) -> str:
    """The store URL to use when none is given.

    In order: the ``STATEKERNEL_STORE`` environment variable; ``store = ...`` at the top
    of ``statekernel.toml`` or under ``[tool.statekernel]`` in ``pyproject.toml``, looked
    for in the working directory and then in each folder above it up to the project's
    root (the first folder holding either file or ``.git``); then the embedded default,
    ``.statekernel/runs.db`` in the project's root (the working directory outside a
    project). A relative SQLite or file path in a config file is relative to that file's
    folder. A malformed file, an unknown key or a bad value raises ``ConfigError``
    naming the file.
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "").strip()
    if value:
        return value
    start = Path.cwd() if cwd is None else Path(cwd)
    root = start
    for folder in (start, *start.parents):
        for name, section in _FILES:
            found = _store_in(folder / name, section)
            if found is not None:
                return _anchored(found, folder)
        if any((folder / marker).exists() for marker in (*(n for n, _ in _FILES), ".git")):
            root = folder
            break
    return _anchored(DEFAULT_STORE_URL, root)


def _anchored(url: str, folder: Path) -> str:
    """``url`` with a relative SQLite or file path made absolute against ``folder``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if scheme.lower() == "sqlite" and rest.startswith("/") and not rest.startswith("//"):
        path, query = rest[1:], ""
        if "?" in path:
            path, query = path.split("?", 1)
            query = "?" + query
        if path and path != ":memory:" and not Path(path).is_absolute():
            return f"sqlite:///{quote(str(folder / path), safe='/')}{query}"
    return url


def _store_in(path: Path, section: tuple[str, ...]) -> str | None:
    try:
        data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    for key in section:
        data = data.get(key) if isinstance(data, dict) else None
    if not isinstance(data, dict):
        return None
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        where = f"[{'.'.join(section)}]" if section else "the top level"
        raise ConfigError(
            f"{str(path)!r}: unknown key(s) {', '.join(unknown)} at {where} "
            f"(known: {', '.join(sorted(_KEYS))})"
        )
    if "store" not in data:
        return None
    store = data["store"]
    if not isinstance(store, str) or not store.strip():
        raise ConfigError(f"{str(path)!r}: 'store' must be a store URL string")
    return store.strip()
