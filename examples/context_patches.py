"""Context patches: tools that change the run's memory along with their results.

Two calls run in parallel; each returns ``sk.ToolReturn(output, context=patch)``. The
patches are committed with the results and applied when both calls have completed,
in the order the model made the calls (the slow first call's patch applies first, so
the second call's value wins), and the next turn's hooks see the patched context.
Run it with ``python examples/context_patches.py``.
"""

from __future__ import annotations

import asyncio
import sys

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
async def set_preference(key: str, value: str, delay: float = 0.0) -> sk.ToolReturn:
    """Remember a user preference.

    Args:
        key: The preference's name.
        value: Its value.
        delay: Seconds to wait first (to show that finishing order does not matter).
    """
    await asyncio.sleep(delay)
    return sk.ToolReturn(f"{key} = {value}", context={"preferences": {key: value}})


class ShowContext(sk.Hooks):
    def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> None:
        print(f"turn {len(run.turns)} sees context {run.context}")


async def main(store: str) -> None:
    model = ScriptedProvider(
        [
            [
                call("set_preference", {"key": "units", "value": "metric", "delay": 0.05}),
                call("set_preference", {"key": "units", "value": "imperial"}),
            ],
            "Saved: imperial units.",
        ]
    )
    async with sk.Kernel(
        store, tools=[set_preference], providers={"scripted": model}, hooks=ShowContext()
    ) as kernel:
        run = await kernel.start(model="scripted/prefs", messages=["Use imperial units."])
        async for _ in kernel.run(run.run_id):
            pass
        done = await kernel.get(run.run_id)
        print(f"run {done.state}; context {done.context}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
