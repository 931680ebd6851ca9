"""Child runs: a lead agent hands a task to a researcher agent, which runs as a run of
its own (its own checkpoints, its own tools), and takes its answer.

The researcher's run id is derived from the lead's run and the call, so a crash can
never start two researchers for one call. Run it with ``python examples/child_runs.py``.
"""

from __future__ import annotations

import asyncio
import sys

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool(idempotent=True)
def search(query: str) -> str:
    """Search the web.

    Args:
        query: What to look for.
    """
    return f"results for {query!r}: the Eiffel Tower is 330 m tall"


researcher = sk.delegate(
    "researcher",
    "Research a question and answer it in one sentence.",
    model="helper/researcher",
    tools=[search],
    instructions="You research with the search tool, then answer in one sentence.",
)


async def main(store: str) -> None:
    providers = {
        "scripted": ScriptedProvider(
            [call("researcher", {"task": "How tall is the Eiffel Tower?"}), "It is 330 m tall."]
        ),
        "helper": ScriptedProvider(
            [call("search", {"query": "Eiffel Tower height"}), "The Eiffel Tower is 330 m tall."]
        ),
    }
    async with sk.Kernel(store, tools=[researcher], providers=providers) as kernel:
        run = await kernel.start(model="scripted/lead", messages=["How tall is it?"], run_id="lead")
        async for _ in kernel.run(run.run_id, raise_on_failure=True):  # RunFailed if it fails
            pass
        lead = await kernel.get(run.run_id)
        for child in await kernel.children(run.run_id):
            print(f"child {child.run_id} of call {child.parent_call_id}: {child.state}")
            print(f"  answered: {child.output}")
        print(f"lead {lead.state}: {lead.output}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
