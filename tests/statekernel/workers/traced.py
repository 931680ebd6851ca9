"""Running ``traced_worker.py`` in a process of its own, and reading the spans it wrote."""

from __future__ import annotations

import asyncio
import json
import sys
from asyncio.subprocess import DEVNULL, PIPE
from pathlib import Path
from typing import Any

WORKER = Path(__file__).parent / "traced_worker.py"


async def serve_traced(url: str, queue: str, spans: Path, run_id: str, *more: str) -> None:
    """Run ``traced_worker.py`` on ``queue`` until ``run_id`` is completed; its spans go
    to ``spans`` (``more``: a child queue)."""
    args = [str(WORKER), url, queue, str(spans), run_id, *more]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-P", *args, stdout=DEVNULL, stderr=PIPE
    )
    _, err = await worker.communicate()
    assert worker.returncode == 0, err.decode()[-3000:]


def exported(path: Path) -> list[dict[str, Any]]:
    """The spans a traced worker wrote to ``path``, one JSON object each."""
    return [json.loads(line) for line in path.read_text().splitlines()]
