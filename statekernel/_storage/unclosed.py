"""``warn_unclosed``: the ``ResourceWarning`` of a kernel or store collected unclosed.

Nothing of a kernel or store keeps the process alive (a SQLite store's thread is a
daemon), but what it held open (a connection, leases, provider clients) is given back
only by ``aclose()`` (or ``async with``): the warning names the object, and for a
store its URL with any password redacted. Python shows ``ResourceWarning`` under
``python -X dev``, ``-W default`` and pytest.
"""

from __future__ import annotations

import warnings

__all__ = ["warn_unclosed"]


def warn_unclosed(what: str, source: object) -> None:
    """Warn that ``what`` (e.g. ``"SQLiteStore 'sqlite:///runs.db'"``) was not closed."""
    warnings.warn(
        f"unclosed {what}: use `async with` or `await aclose()` on it",
        ResourceWarning,
        stacklevel=2,
        source=source,
    )
