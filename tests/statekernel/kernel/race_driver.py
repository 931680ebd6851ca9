"""A process that drives runs of a shared store, for the ownership tests.

Usage: python race_driver.py MODE URL LEDGER LEASE_TTL BUSY_TIMEOUT SLOW RUN_ID...

``MODE`` is ``race`` (loop over the runs one at a time, moving on when a run is busy,
until every run is completed), ``takeover`` (the same, but the first busy run ends the
process: it came to take over dead owners' runs) or ``all`` (drive every run at once,
for a process that is killed in the middle). ``SLOW`` seconds is how long both tools of
run ``i`` sleep in turn ``i % TURNS`` (0: never slow). The process prints ``READY`` and
waits for a line on stdin before it drives anything, so that racing processes start
together; at the end it prints one line of JSON with what it saw (busy runs, uncertain
pauses, lost commits).

Every tool execution appends ``start <run>:<call> <attempt> <pid> <tool>`` to LEDGER
before its effect and ``end ... <ok|cancelled>`` after (O_APPEND, fsynced): the ledger
the tests check from outside.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import statekernel as sk
from statekernel.errors import ConflictError, InvalidArgument, InvalidTransition, RunBusy
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider, call

TURNS = 4
UNCERTAIN = "uncertain_tool_calls"
UNKNOWN = "outcome unknown: the process running it died before it finished"
DEADLINE = 90.0
"""Seconds after which a driver gives up on runs it could not complete."""


def ownership(lease_ttl: float, busy_timeout: float) -> dict[str, Any]:
    """The Kernel options of run ownership, the only place this script names them.

    ``SK_RACE_WITHOUT_OWNERSHIP=1`` leaves them out: on a kernel without ownership that
    shows the race the ownership tests exist to catch.
    """
    if os.environ.get("SK_RACE_WITHOUT_OWNERSHIP"):
        return {}
    return {"lease_ttl": lease_ttl, "busy_timeout": busy_timeout}


def script() -> list[object]:
    """Each turn asks for a non-idempotent ``side_effect`` and an idempotent ``lookup``."""
    items: list[object] = [
        [call("side_effect", {"key": f"s{i}"}), call("lookup", {"key": f"l{i}"})]
        for i in range(TURNS)
    ]
    return [*items, "all done"]


def append(path: str, line: str) -> None:
    """Append one line to the ledger and make it durable before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def agent(ledger: str, slow: float, run_ids: list[str]) -> dict[str, Any]:
    """Kernel options: the scripted model and the two ledger-writing tools."""
    slow_turn = {run_id: i % TURNS for i, run_id in enumerate(run_ids)}

    async def effect(tool: str, ctx: sk.ToolContext) -> None:
        key = f"{ctx.run_id}:{ctx.call_id} {ctx.attempt} {os.getpid()}"
        turn = int(ctx.call_id.split("_")[1])
        pause = slow if slow and slow_turn.get(ctx.run_id) == turn else random.uniform(0.02, 0.05)
        append(ledger, f"start {key} {tool}")
        status = "cancelled"
        try:
            await asyncio.sleep(pause)
            status = "ok"
        finally:
            append(ledger, f"end {key} {tool} {status}")

    @sk.tool
    async def side_effect(key: str, ctx: sk.ToolContext) -> str:
        """Not idempotent: one ledger execution."""
        await effect("side", ctx)
        return f"wrote {key}"

    @sk.tool(idempotent=True)
    async def lookup(key: str, ctx: sk.ToolContext) -> str:
        """Idempotent: one ledger execution."""
        await effect("idem", ctx)
        return f"value {key}"

    return {
        "tools": [side_effect, lookup],
        "providers": {"scripted": ScriptedProvider(script())},
        "max_turns": None,
    }


def executions(ledger: str) -> dict[str, list[str]]:
    """``run:call`` -> the ledger lines about it, in order."""
    found: dict[str, list[str]] = {}
    try:
        with open(ledger) as fh:
            for line in fh:
                parts = line.split()
                found.setdefault(parts[1], []).append(parts[0])
    except FileNotFoundError:
        pass
    return found


def resolution(ledger: str, run_id: str, c: dict[str, Any]) -> dict[str, Any]:
    """What the ledger says about an uncertain call: ran to its end, started, or not."""
    marks = executions(ledger).get(f"{run_id}:{c['id']}", [])
    if "end" in marks:
        prefix = "wrote" if c["name"] == "side_effect" else "value"
        return {"output": f"{prefix} {c['input']['key']}"}
    if "start" in marks:
        return {"error": UNKNOWN}
    return {"rerun": True}


class Stop(Exception):
    """A taking-over process found a run busy: it reports and stops."""


class Driver:
    """Drives runs with one kernel and counts what it saw."""

    def __init__(self, kernel: sk.Kernel, ledger: str, *, stop_on_busy: bool) -> None:
        self.kernel = kernel
        self.ledger = ledger
        self.stop_on_busy = stop_on_busy
        self.seen: Counter[str] = Counter()
        self.uncertain: list[str] = []

    async def once(self, run_id: str) -> bool:
        """Drive the run once; True when it is completed."""
        try:
            async for _ in self.kernel.run(run_id):
                pass
        except RunBusy as exc:
            self.seen["busy"] += 1
            if self.stop_on_busy:
                raise Stop(str(exc)) from exc
            return False
        except ConflictError:
            self.seen["lost"] += 1
            return False
        run = await self.kernel.get(run_id)
        if run.state == "completed":
            return True
        if run.pause is not None and run.pause.reason == UNCERTAIN:
            await self.resolve(run_id, run.pause.metadata["calls"])
            return False
        raise SystemExit(f"run {run_id} rests in {run.state}: {run.pause}")

    async def resolve(self, run_id: str, calls: list[dict[str, Any]]) -> None:
        """Answer an uncertain pause from the ledger (another process may answer first)."""
        for c in calls:
            self.uncertain.append(f"{run_id}:{c['id']}")
            try:
                await self.kernel.resolve_tool_call(
                    run_id, c["id"], **resolution(self.ledger, run_id, c)
                )
            except (ConflictError, InvalidArgument, InvalidTransition):
                self.seen["resolve_lost"] += 1

    async def until_done(self, run_id: str) -> None:
        while True:
            if await self.once(run_id):
                return

    async def race(self, run_ids: list[str]) -> None:
        """Loop over the runs, one at a time, until each is completed."""
        pending = list(run_ids)
        while pending:
            pending = [r for r in pending if not await self.once(r)]

    async def all_at_once(self, run_ids: list[str]) -> None:
        await asyncio.gather(*(self.until_done(r) for r in run_ids))

    def report(self) -> str:
        return json.dumps(
            {"pid": os.getpid(), "seen": dict(self.seen), "uncertain": self.uncertain}
        )


async def main(argv: list[str]) -> None:
    mode, url, ledger, lease_ttl, busy_timeout, slow, *run_ids = argv
    store = open_store(url)
    options = agent(ledger, float(slow), run_ids)
    kernel = sk.Kernel(store, **options, **ownership(float(lease_ttl), float(busy_timeout)))
    driver = Driver(kernel, ledger, stop_on_busy=mode == "takeover")
    modes: dict[str, Callable[[list[str]], Awaitable[None]]] = {
        "race": driver.race,
        "takeover": driver.race,
        "all": driver.all_at_once,
    }
    print("READY", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        try:
            await asyncio.wait_for(modes[mode](run_ids), DEADLINE)
        except TimeoutError:
            driver.seen["deadline"] += 1
        except Stop:
            pass
        print(driver.report(), flush=True)
    finally:
        await kernel.aclose()
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
