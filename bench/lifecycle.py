"""Lifecycle cost per event: the table against python-statemachine's engine.

Drives runs of ``--turns`` turns with the payloads a kernel sends: each turn the model
asks for one tool call with ~200 bytes of arguments, the tool returns ~1 KB, and the last
turn answers with text. The same events go through ``Lifecycle`` (the table derived from
``RunLifecycle``), through ``LibraryLifecycle`` (the library's engine), and through the
pure ``_lifecycle.transitions`` functions alone (what any engine has to pay). Prints medians over
repeats: us per event, and us to build one lifecycle. ``--repeats 1 --turns 2`` runs in a
second. Run: ``python bench/lifecycle.py [--repeats 7] [--turns 50]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import statekernel as sk
from statekernel._lifecycle import transitions as tr
from statekernel._lifecycle.chart import PAYLOAD_DEFAULTS, LibraryLifecycle, Lifecycle

AT = datetime(2025, 1, 1, tzinfo=UTC)
ARGUMENTS = '{"payload": "' + "x" * 180 + '"}'
OUTPUT = "y" * 1024
TOOLS = (sk.ToolSpec("work", "Do some work and return about 1 KB.", {"type": "object"}),)

Step = tuple[str, dict[str, Any]]


def turn(run: sk.Run, last: bool) -> Iterator[Step]:
    """The events of one turn; the payload of the first depends on ``run``."""
    index = len(run.turns)
    yield "turn_prepared", {"request": sk.ModelRequest("scripted/bench", run.messages, TOOLS)}
    yield "model_started", {}
    if last:
        answer = sk.ModelResult(sk.Message.assistant("done"), finish_reason="stop")
        yield (
            "model_completed",
            {"result": answer, "finish": "stop", "then_pause": None, "reask": None},
        )
        return
    call = sk.ToolCall(f"call_{index}", "work", ARGUMENTS)
    answer = sk.ModelResult(sk.Message.assistant(tool_calls=[call]), finish_reason="tool_calls")
    yield "model_completed", {"result": answer, "finish": None, "then_pause": None, "reask": None}
    yield "tool_call_started", {"call_ids": [call.id], "call_input": {"payload": "x" * 180}}
    yield (
        "tool_call_completed",
        {
            "call_ids": [call.id],
            "output": OUTPUT,
            "error": None,
            "resolved": False,
            "context": None,
            "skipped": None,
        },
    )
    yield "tools_completed", {"finish": None, "then_pause": None, "reask": None}


def new_run() -> sk.Run:
    return sk.Run("bench", "scripted/bench", messages=(sk.Message.user("go"),))


def drive(make: Callable[[sk.Run], Lifecycle], turns: int) -> float:
    """Seconds per event over a run of ``turns`` turns."""
    lc = make(new_run())
    gc.collect()
    began = time.perf_counter()
    lc.apply("start", at=AT)
    n = 1
    for i in range(turns):
        for event, payload in turn(lc.run, last=i == turns - 1):
            lc.apply(event, at=AT, **payload)
            n += 1
    elapsed = time.perf_counter() - began
    assert lc.run.state == "completed", lc.run.state
    return elapsed / n


def drive_transitions(turns: int) -> float:
    """Seconds per event calling only the pure transition functions."""
    run = new_run()
    gc.collect()
    began = time.perf_counter()
    run, _ = tr.start(run, AT)
    n = 1
    for i in range(turns):
        for event, payload in turn(run, last=i == turns - 1):
            full = {**PAYLOAD_DEFAULTS.get(event, {}), **payload}  # as the chart fills it
            run, _ = getattr(tr, event)(run, at=AT, **full)
            n += 1
    return (time.perf_counter() - began) / n


def construction(make: Callable[[sk.Run], Lifecycle], count: int = 200) -> float:
    """Seconds to build one lifecycle at a run."""
    run = new_run()
    gc.collect()
    began = time.perf_counter()
    for _ in range(count):
        make(run)
    return (time.perf_counter() - began) / count


def median_us(sample: Callable[[], float], repeats: int) -> float:
    sample()  # warm up
    return statistics.median(sample() for _ in range(repeats)) * 1e6


def main(repeats: int, turns: int) -> None:
    table = median_us(lambda: drive(Lifecycle, turns), repeats)
    engine = median_us(lambda: drive(LibraryLifecycle, turns), repeats)
    floor = median_us(lambda: drive_transitions(turns), repeats)
    events = 1 + 6 * (turns - 1) + 3  # start, full turns, the last (text) turn
    print(f"{turns} turns, {events} events per run, medians of {repeats} runs")
    print(f"{'':28} {'us/event':>9} {'build us':>9}")
    for name, per_event, make in (
        ("Lifecycle (table)", table, Lifecycle),
        ("LibraryLifecycle (engine)", engine, LibraryLifecycle),
    ):
        build = median_us(functools.partial(construction, make), repeats)
        print(f"{name:28} {per_event:>9.1f} {build:>9.1f}")
    print(f"{'_transitions functions only':28} {floor:>9.1f}")
    print(f"engine / table per event: {engine / table:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--turns", type=int, default=50)
    args = parser.parse_args()
    main(args.repeats, args.turns)
