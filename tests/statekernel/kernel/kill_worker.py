"""A worker process for the SIGKILL tests: drives one run on a store until it completes.

Usage: python kill_worker.py STORE_URL RUN_ID LOG_PATH TURNS

With ``SK_KILL_ENTRY=start_and_run`` a run that does not exist yet is created and driven
by ``Kernel.start_and_run`` (``READY`` comes before it is created); otherwise by
``start`` then ``run``. Prints ``READY`` once the run is loaded (or about to be
created), then ``ACK <revision>`` after every persisted event it saw committed. Every
tool execution appends a line to LOG_PATH (fsynced) before the tool returns: that file
is the side-effect ledger checked from outside.
"""

from __future__ import annotations

import asyncio
import os
import sys

import statekernel as sk
from statekernel.errors import RunNotFound
from statekernel.stores import open_store
from statekernel.testing import Reply, ScriptedProvider, call


def script(turns: int) -> list[object]:
    """The model's answers; each takes ``SK_KILL_MODEL_DELAY`` seconds (default 0)."""
    delay = float(os.environ.get("SK_KILL_MODEL_DELAY", "0"))
    items: list[object] = []
    for i in range(turns):
        calls = (call("side_effect", {"key": f"s{i}"}), call("lookup", {"key": f"l{i}"}))
        items.append(Reply(tool_calls=calls, delay=delay) if delay else list(calls))
    return [*items, Reply("all done", delay=delay) if delay else "all done"]


def agent(log_path: str, turns: int) -> dict[str, object]:
    def append(line: str) -> None:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    @sk.tool
    async def side_effect(key: str, ctx: sk.ToolContext) -> str:
        """Not idempotent: appends to the ledger."""
        append(f"side {ctx.call_id} {ctx.idempotency_key}")
        await asyncio.sleep(0.002)
        return f"wrote {key}"

    @sk.tool(idempotent=True)
    async def lookup(key: str, ctx: sk.ToolContext) -> str:
        """Idempotent: appends to the ledger."""
        append(f"idem {ctx.call_id} {ctx.idempotency_key}")
        await asyncio.sleep(0.002)
        return f"value {key}"

    return {
        "tools": [side_effect, lookup],
        "providers": {"scripted": ScriptedProvider(script(turns))},
        "max_turns": None,
    }


def side_effects(log_path: str) -> set[str]:
    try:
        with open(log_path) as fh:
            return {line.split()[1] for line in fh if line.startswith("side ")}
    except FileNotFoundError:
        return set()


async def main(url: str, run_id: str, log_path: str, turns: int) -> None:
    store = open_store(url)
    # a short lease: on Redis a killed owner's run is taken over once its lease expired
    kernel = sk.Kernel(store, lease_ttl=1.0, **agent(log_path, turns))  # type: ignore[arg-type]
    together = os.environ.get("SK_KILL_ENTRY") == "start_and_run"
    try:
        try:
            await kernel.get(run_id)
            fresh = False
        except RunNotFound:
            fresh = True
            if not together:
                await kernel.start(model="scripted/kill", messages=["go"], run_id=run_id)
        print("READY", flush=True)
        while True:
            if fresh and together:  # created and driven in one call (its first commit)
                fresh = False
                events = kernel.start_and_run(model="scripted/kill", messages=["go"], run_id=run_id)
            else:
                events = kernel.run(run_id)
            async for event in events:
                if event.persisted:
                    print(f"ACK {event.revision}", flush=True)
            run = await kernel.get(run_id)
            print(f"ACK {run.revision}", flush=True)
            if run.state == "completed":
                return
            if run.pause is None:
                raise SystemExit(f"unexpected rest state {run.state}")
            done = side_effects(log_path)
            for c in run.pause.metadata["calls"]:
                if c["id"] in done:
                    key = c["input"]["key"]
                    await kernel.resolve_tool_call(run_id, c["id"], output=f"wrote {key}")
                else:
                    await kernel.resolve_tool_call(run_id, c["id"], rerun=True)
    finally:
        await kernel.aclose()
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
