"""``statekernel runs delete`` on a run another process drives: it waits, then exits 2,
and the driving process goes on unharmed (``stall_driver.py`` holds the run)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..kernel.test_stalled_owner import created, url_of
from .test_cli_runs import sk

DRIVER = Path(__file__).parents[1] / "kernel" / "stall_driver.py"


@pytest.mark.parametrize(
    "kind",
    [
        "sqlite",
        "file",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_delete_never_cuts_a_run_another_process_drives(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = url_of(kind, tmp_path, request)
    ledger = tmp_path / "ledger"
    run_id = asyncio.run(created(url))
    holder = subprocess.Popen(
        [sys.executable, str(DRIVER), "hold", url, str(ledger), run_id, "5", "5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "INTENT"  # it holds the run, mid-call
        refused = sk(
            "runs", "delete", run_id, "--yes", "--wait", "0.2", "--store", url, cwd=tmp_path
        )
        assert refused.returncode == 2, refused.stdout
        assert "driven by" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        holder.stdin.write("go\n")
        holder.stdin.flush()
    out, _ = holder.communicate(timeout=120)
    assert json.loads(out.strip().splitlines()[-1]) == {"outcome": "done", "state": "completed"}
    assert len(ledger.read_text().splitlines()) == 1
    deleted = sk("runs", "delete", run_id, "--yes", "--store", url, cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    shown = sk("runs", "show", run_id, "--store", url, cwd=tmp_path)
    assert shown.returncode != 0
