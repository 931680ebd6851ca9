"""Eager dispatch: a slow search starts while the model still streams its answer.

The model asks for a slow search (1 s), then, 0.5 s later, a quick lookup. With
``DispatchPolicy(eager=True)`` the search starts as soon as its arguments have streamed
(its intent committed first, with the answer so far), so the turn's calls are done
about 1 s after the answer began instead of 1.5 s. Then an answer is cut
off by a failing stream after the first call started: the answer committed with it
becomes the turn's answer, and the model reads the result in the next turn.
Run it with ``python examples/eager_dispatch.py``.
"""

from __future__ import annotations

import asyncio
import sys
import time

import statekernel as sk
from statekernel.errors import ProviderError
from statekernel.testing import Reply, ScriptedProvider, call


@sk.tool(idempotent=True)
async def search(query: str) -> str:
    """Search the web (slow).

    Args:
        query: What to search for.
    """
    await asyncio.sleep(1.0)
    return f"{query}: a jazz festival"


@sk.tool(idempotent=True)
async def lookup(city: str) -> str:
    """Look up the weather of a city (quick).

    Args:
        city: The city.
    """
    await asyncio.sleep(0.1)
    return f"{city}: sunny"


CALLS = [call("search", {"query": "Lyon this weekend"}), call("lookup", {"city": "Lyon"})]


async def drive(store: str, answer: Reply, eager: bool) -> sk.Run:
    model = ScriptedProvider([answer, "Sunny, with a jazz festival."])
    policy = sk.DispatchPolicy(eager=eager)
    async with sk.Kernel(
        store, tools=[search, lookup], providers={"scripted": model}, dispatch=policy
    ) as kernel:
        run = await kernel.start(model="scripted/weather", messages=["Lyon this weekend?"])
        began = time.perf_counter()
        async for event in kernel.run(run.run_id):
            if event.type in ("tool_call_started", "model_completed"):
                extra = " (early)" if event.data.get("early") else ""
                cut = f" cut off: {event.data['cut_off']}" if "cut_off" in event.data else ""
                print(f"  {time.perf_counter() - began:4.2f}s {event.type}{extra}{cut}")
        return await kernel.get(run.run_id)


async def main(store: str) -> None:
    answer = Reply(text="Let me look.", tool_calls=CALLS, between_calls=0.5)
    for eager in (False, True):
        print(f"eager={eager}:")
        done = await drive(store, answer, eager)
        print(f"  run {done.state}: {done.output}")
    print("a stream that fails after the first call started:")
    failing = Reply(tool_calls=CALLS[:1], cut_off=ProviderError("connection reset"))
    done = await drive(store, failing, True)
    print(f"  run {done.state}: {done.output}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
