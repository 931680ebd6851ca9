"""API keys as providers read them: from an argument or the environment, surrounding
whitespace stripped (secret files and ``.env`` lines often end in a newline, which
HTTP refuses in a header), inner whitespace refused, and the key remembered so that
``redact`` hides it in every form from everything statekernel shows, logs or stores."""

from __future__ import annotations

import os

from statekernel._secrets import remember
from statekernel.errors import ConfigError

__all__ = ["api_key"]


def api_key(given: str | None, variable: str | None) -> str | None:
    """The key ``given`` (``api_key=...``), else the one in ``variable``; None if neither.

    ``ConfigError`` names where a key with whitespace inside came from, never the key.
    """
    source = "api_key=..."
    raw = given
    if raw is None and variable:
        raw, source = os.environ.get(variable), variable
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ConfigError(f"{source}: an API key must be a str, not {type(raw).__name__}")
    remember(raw)
    key = raw.strip()
    if any(c.isspace() or not c.isprintable() for c in key):
        raise ConfigError(
            f"{source}: the API key has whitespace or control characters inside it"
            " (is it two values, or a file with several lines?)"
        )
    return key or None
