"""The web view's runs list with many runs in the store: how long the list page takes.

Fills a SQLite store with ``--runs`` runs (a tenth of them paused on a question, so the
"waiting for" column is filled), then times ``GET /`` (the newest 50), ``GET
/?state=paused`` and the second page (through its cursor) through the app, in process
(Starlette's test client: no network in the figure). Prints the median and the slowest
of ``--repeats`` requests of each; the goal for 10,000 runs is under a second. Run:
``python bench/web_list.py [--runs 10000] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

import statekernel as sk
from statekernel.testing import ScriptedProvider, call
from statekernel.web import create_app

ASK = sk.ask_user(answer_schema={"type": "integer"})


def options() -> dict[str, object]:
    script = [call("ask_user", {"question": "How many?"}), "done"]
    return {"tools": [ASK], "providers": {"scripted": ScriptedProvider(script)}}


async def fill(url: str, runs: int) -> None:
    """``runs`` runs: every tenth paused on a question, the others just started."""
    async with sk.Kernel(url, **options()) as kernel:  # type: ignore[arg-type]
        for n in range(runs):
            run = await kernel.start(model="scripted/bench", messages=["go"], run_id=f"r{n:06d}")
            if n % 10 == 0:
                async for _ in kernel.run(run.run_id):
                    pass


def timed(client: TestClient, path: str, repeats: int) -> tuple[float, float, str]:
    """(median, slowest) seconds of ``GET path``, and the last page."""
    times, text = [], ""
    for _ in range(repeats):
        started = time.perf_counter()
        answer = client.get(path)
        times.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text[:500]
        text = answer.text
    return statistics.median(times), max(times), text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'runs.db'}"
        started = time.perf_counter()
        asyncio.run(fill(url, args.runs))
        print(f"web list: {args.runs:,} runs in a SQLite store (filled in "
              f"{time.perf_counter() - started:.1f} s), {args.repeats} requests each")  # fmt: skip
        with TestClient(create_app(url), base_url="http://localhost") as client:
            first = client.get("/").text
            found = re.search(r'rel="next" href="[^"]*\?([^"]+)"', first)
            pages = [("GET /", "/"), ("GET /?state=paused", "/?state=paused")]
            if found is not None:
                pages.append(("second page", "/?" + found.group(1).replace("&amp;", "&")))
            for label, path in pages:
                median, slowest, text = timed(client, path, args.repeats)
                rows = text.count('<tr class="state-')
                print(f"{label:<20} {rows:>3} rows  median {median * 1000:,.1f} ms  "
                      f"slowest {slowest * 1000:,.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
