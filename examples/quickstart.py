"""Quickstart: an agent with one tool, driven by the kernel, offline.

The model is scripted (no keys, no network); swap ``model=`` for
``"openai/gpt-4o-mini"`` or ``"anthropic/claude-sonnet-4-5"`` to use a real one.
Run it with ``python examples/quickstart.py``.
"""

from __future__ import annotations

import asyncio
import sys

import statekernel as sk
from statekernel.testing import Reply, ScriptedProvider, call


@sk.tool(idempotent=True)
def get_weather(city: str) -> dict[str, str]:
    """Current weather for a city.

    Args:
        city: The city's name.
    """
    return {"city": city, "sky": "sunny", "temperature": "21 C"}


async def main(store: str) -> None:
    model = ScriptedProvider(
        [call("get_weather", {"city": "Paris"}), Reply(text="It is sunny in Paris, 21 C.", chunk=8)]
    )
    async with sk.Kernel(store, tools=[get_weather], providers={"scripted": model}) as kernel:
        run = await kernel.start(
            model="scripted/weather",
            messages=[sk.Message.user("Weather in Paris?")],
            context={"user": "u1"},
        )
        streaming = False
        # raise_on_failure: a run that fails (a missing API key, a hook that raised) raises
        # RunFailed once its failure is committed, instead of ending the loop in silence
        async for event in kernel.run(run.run_id, raise_on_failure=True):
            if event.type == "text_delta":
                print(event.data["text"], end="", flush=True)
                streaming = True
            elif event.persisted:
                print(("\n" if streaming else "") + f"[r{event.revision}] {event.type}")
                streaming = False
        done = await kernel.get(run.run_id)
        print(f"run {done.run_id}: {done.state} after {done.revision} commits")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
