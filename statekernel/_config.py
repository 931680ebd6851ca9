"""Where the default store comes from: environment, project configuration, built-in default."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from statekernel.errors import ConfigError

__all__ = ["DEFAULT_STORE_URL", "ENV_VAR", "default_store_url"]

ENV_VAR = "STATEKERNEL_STORE"
DEFAULT_STORE_URL = "sqlite:///.statekernel/runs.db"
"""The embedded default: a SQLite file under ``.statekernel/`` in the working directory."""

_FILES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("statekernel.toml", ()),
    ("pyproject.toml", ("tool", "statekernel")),
)


def default_store_url(
    *, environ: Mapping[str, str] | None = None, cwd: str | Path | None = None
) -> str:
    """The store URL to use when none is given.

    In order: the ``STATEKERNEL_STORE`` environment variable; ``store = ...`` under
    ``[tool.statekernel]`` in ``pyproject.toml`` or at the top of ``statekernel.toml``
    in the working directory (``statekernel.toml`` first); then
    ``sqlite:///.statekernel/runs.db``. A malformed file or value raises
    ``ConfigError`` naming the file.
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "").strip()
    if value:
        return value
    folder = Path.cwd() if cwd is None else Path(cwd)
    for name, section in _FILES:
        found = _store_in(folder / name, section)
        if found is not None:
            return found
    return DEFAULT_STORE_URL


def _store_in(path: Path, section: tuple[str, ...]) -> str | None:
    try:
        data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    for key in section:
        data = data.get(key) if isinstance(data, dict) else None
    if not isinstance(data, dict) or "store" not in data:
        return None
    store = data["store"]
    if not isinstance(store, str) or not store.strip():
        raise ConfigError(f"{str(path)!r}: 'store' must be a store URL string")
    return store.strip()
