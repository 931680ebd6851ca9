"""CPU cost of the stored format alone: encoding a run's commits and decoding them back.

The commits are those of a 20-turn run of the workload of ``bench/stores.py``
(``bench/stores_workload.py``: each turn a tool call with ~200 bytes of arguments and a
~1 KB output, two commits a turn). Prints
the best of the repeats, in CPU microseconds of this thread: ``encode_commit`` per
commit (each on top of the head before it, as a store does), the decode of the whole
run with every turn read, and the decode of the commit log's events per commit.
Run: ``python bench/stored_format.py [--repeats 40]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit
from collections.abc import Callable
from typing import Any

from stores_workload import get_weather, script

import statekernel as sk
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel.stores import open_store
from statekernel.stores._format.codec import EncodedCommit, decode_events, decode_run, encode_commit
from statekernel.testing import ScriptedProvider

TURNS = 20


class Kept(StoreWrapper):
    """A store that keeps the checkpoints it commits."""

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.checkpoints: list[Checkpoint] = []

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        await self.inner.commit(checkpoint, lease=lease)
        self.checkpoints.append(checkpoint)


async def commits() -> list[Checkpoint]:
    """The checkpoints of one run of ``TURNS`` turns."""
    store = Kept(open_store("memory://"))
    provider = ScriptedProvider(script(TURNS))
    kernel = sk.Kernel(store, tools=[get_weather], providers={"scripted": provider}, max_turns=None)
    async with kernel:
        run = await kernel.start(model="scripted/bench", messages=["Weather in Paris?"])
        async for _ in kernel.run(run.run_id):
            pass
    return store.checkpoints


def encode_all(cps: list[Checkpoint]) -> list[EncodedCommit]:
    """Every commit encoded on top of the head before it."""
    prior: dict[str, Any] | None = None
    known: frozenset[str] | None = None
    out: list[EncodedCommit] = []
    for cp in cps:
        enc = encode_commit(cp, prior, known)
        prior, known = enc.head, enc.refs
        out.append(enc)
    return out


def best(fn: Callable[[], object], number: int, repeats: int) -> float:
    """The best seconds per call of ``fn``, in CPU time of this thread."""
    timer = timeit.Timer(fn, timer=time.thread_time)
    return min(timer.repeat(repeat=repeats, number=number)) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    repeats = parser.parse_args().repeats
    cps = asyncio.run(commits())
    encoded = encode_all(cps)
    messages = [m for e in encoded for m in e.messages]
    turns = [t for e in encoded for t in e.turns]
    blobs: dict[str, bytes] = {}
    for e in encoded:
        for key, data in e.blobs.items():
            blobs.setdefault(key, data)
    entries = [(cp.run.revision, e.entry) for cp, e in zip(cps, encoded, strict=True)]
    run_id = cps[0].run.run_id

    def load() -> None:
        run = decode_run(encoded[-1].head, messages, turns, blobs)
        for turn in run.turns:
            assert turn.index >= 0

    n = len(cps)
    encode = best(lambda: encode_all(cps), 3, repeats) / n
    decode = best(load, 3, repeats)
    events = best(lambda: decode_events(entries, run_id), 10, repeats) / n
    print(f"{n} commits of a {TURNS}-turn run, best of {repeats}, CPU µs:")
    print(f"  encode_commit       {encode * 1e6:8.1f} per commit")
    print(f"  decode the run      {decode * 1e6:8.1f} per run ({decode / n * 1e6:.1f} per commit)")
    print(f"  decode its events   {events * 1e6:8.1f} per commit")


if __name__ == "__main__":
    main()
