"""``statekernel runs show`` as the tests of the kernel read it: the installed console
script, in a plain wide terminal."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

EXE = shutil.which("statekernel")
"""The console script (None when it is not installed: the tests that need it skip)."""


def runs_show(run_id: str, url: str, *flags: str) -> str:
    """What ``statekernel runs show RUN_ID --store URL FLAGS...`` prints (it must succeed)."""
    assert EXE is not None
    env = {"COLUMNS": "200", "NO_COLOR": "1", "PATH": str(Path(EXE).parent)}
    command = [EXE, "runs", "show", run_id, "--store", url, *flags]
    return subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
