"""Kernel overhead per turn and per commit on the memory store.

Each turn: the scripted model returns one tool call with ~200 bytes of arguments,
the tool returns ~1 KB, the last turn returns text. Prints medians over repeats, at
N = 10, 100 and 1000 turns (``--turns``: other run lengths, two at least; the flatness
is the last over the first). ``--repeats 1 --turns 2,4`` runs in a second.
Run: ``python bench/kernel_overhead.py [--repeats 5] [--turns 10,100,1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

import statekernel as sk
from statekernel.testing import ScriptedProvider, call

ARGUMENT = "x" * 180
OUTPUT = "y" * 1024


@sk.tool
def work(payload: str) -> str:
    """Do some work and return about 1 KB."""
    return OUTPUT


def script(turns: int) -> list[object]:
    items: list[object] = [call("work", {"payload": ARGUMENT}) for _ in range(turns - 1)]
    return [*items, "done"]


async def one_run(turns: int) -> tuple[float, int]:
    provider = ScriptedProvider(script(turns))
    kernel = sk.Kernel("memory://", tools=[work], providers={"scripted": provider}, max_turns=None)
    run = await kernel.start(model="scripted/bench", messages=["go"])
    gc.collect()
    began = time.perf_counter()
    async for _ in kernel.run(run.run_id):
        pass
    elapsed = time.perf_counter() - began
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert len(final.turns) == turns
    return elapsed, final.revision


async def main(repeats: int, sizes: list[int]) -> None:
    print(f"{'turns':>6} {'us/turn':>10} {'us/commit':>10} {'commits':>8}")
    per_turn_by_n: dict[int, float] = {}
    for turns in sizes:
        samples = [await one_run(turns) for _ in range(repeats)]
        commits = samples[0][1]  # revision: commits after the one that created the run
        per_turn = statistics.median(s / turns for s, _ in samples) * 1e6
        per_commit = statistics.median(s / commits for s, _ in samples) * 1e6
        per_turn_by_n[turns] = per_turn
        print(f"{turns:>6} {per_turn:>10.0f} {per_commit:>10.0f} {commits:>8}")
    low, top = sizes[0], sizes[-1]
    flat = per_turn_by_n[top] / per_turn_by_n[low]
    print(
        f"per-turn cost at N={top} / N={low}: {flat:.2f} (1.0 = flat in N); target <= 1000 us/turn"
    )


def parse_sizes(text: str) -> list[int]:
    """``10,100,1000``: two run lengths at least, in increasing order."""
    sizes = sorted(int(n) for n in text.split(","))
    if len(sizes) < 2 or sizes[0] < 1:
        raise argparse.ArgumentTypeError("two run lengths at least, each 1 or more")
    return sizes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=parse_sizes, default=[10, 100, 1000])
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.turns))
