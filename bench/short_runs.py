"""A short run's fixed costs: ``start`` then ``run`` beside ``start_and_run``, per store.

The anchor workload's turn (a scripted tool call with ~200 bytes of arguments, a tool
returning ~1 KB, the last turn in text) at a few short run lengths, on the SQLite,
file and memory stores (and PostgreSQL with ``--postgres URL``: a schema of its own,
dropped at the end). Each repeat measures both ways on a fresh store, one after the
other, so each ratio compares runs made seconds apart; medians over repeats.
``start_and_run`` drives the run from the revision it committed, without reading
it back: the ratio is what that read costs a run of that length.
Run: ``python bench/short_runs.py [--repeats 15] [--turns 1,3,10] [--postgres URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import statekernel as sk
from statekernel.stores import CheckpointStore, open_store
from statekernel.testing import ScriptedProvider, call

ARGUMENTS = {"query": "q" * 120, "top_k": 5, "lang": "en", "note": "n" * 40}
OUTPUT = "y" * 1024


@sk.tool
def search(query: str, top_k: int, lang: str, note: str) -> str:
    """Search, returning about 1 KB."""
    return OUTPUT


def _script(turns: int) -> list[object]:
    items: list[object] = [call("search", ARGUMENTS, id=f"c{t}") for t in range(1, turns)]
    return [*items, "done"]


async def _missing(store: CheckpointStore) -> None:
    """Load a run that is not there (each of two at once opens a connection of its own)."""
    with contextlib.suppress(sk.RunNotFound):
        await store.load("warm-up")


async def _one(url: str, turns: int, together: bool) -> float:
    store = open_store(url)
    kernel = sk.Kernel(
        store, tools=[search], providers={"scripted": ScriptedProvider(_script(turns))}
    )
    try:
        # before the clock: the store's tables (a run created and deleted) and its
        # connections (a drive holds two on PostgreSQL: two loads at once open them)
        await kernel.start(model="scripted/b", messages=["go"], run_id="warm-up")
        await store.delete("warm-up")
        await asyncio.gather(_missing(store), _missing(store))
        gc.collect()
        began = time.perf_counter()
        if together:
            async for _ in kernel.start_and_run(model="scripted/b", messages=["go"], run_id="r"):
                pass
        else:
            await kernel.start(model="scripted/b", messages=["go"], run_id="r")
            async for _ in kernel.run("r"):
                pass
        elapsed = time.perf_counter() - began
        assert (await kernel.get("r")).state == "completed"
        return elapsed
    finally:
        await kernel.aclose()
        await store.aclose()


async def _drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--turns", default="1,3,10")
    parser.add_argument("--postgres", help="a PostgreSQL URL (a schema of its own is used)")
    args = parser.parse_args()
    lengths = [int(n) for n in args.turns.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="short-runs-"))
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    stores = {"sqlite://": "sqlite", "file://": "file", "memory://": "memory"}
    if args.postgres:
        stores["postgresql://"] = "postgres"
    print(f"{'ms per run (median)':24} {'turns':>5} {'start+run':>10} {'together':>9} {'ratio':>6}")
    try:
        for label, kind in stores.items():
            for turns in lengths:
                apart: list[float] = []
                together: list[float] = []
                ratios: list[float] = []
                for rep in range(args.repeats + 1):  # the first is a warm-up
                    pair = []
                    for joint in (False, True):
                        name = f"{kind}-{turns}-{rep}-{int(joint)}"
                        if kind == "sqlite":
                            url = f"sqlite:///{folder / name}.db"
                        elif kind == "file":
                            url = f"file://{folder / name}"
                        elif kind == "postgres":
                            sep = "&" if "?" in args.postgres else "?"
                            url = f"{args.postgres}{sep}schema={schema}_{rep}_{int(joint)}"
                        else:
                            url = "memory://"
                        pair.append(await _one(url, turns, joint))
                        if kind == "postgres":
                            await _drop_schema(args.postgres, f"{schema}_{rep}_{int(joint)}")
                    if rep:
                        apart.append(pair[0])
                        together.append(pair[1])
                        ratios.append(pair[1] / pair[0])
                a, t = statistics.median(apart) * 1e3, statistics.median(together) * 1e3
                r = statistics.median(ratios)
                print(f"{label:24} {turns:>5} {a:>10.2f} {t:>9.2f} {r:>6.2f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("ratio = start_and_run / (start + run), median of the ratios within a repeat")


if __name__ == "__main__":
    asyncio.run(main())
