"""Interactive tools: a tool asks the user, the run waits in the store for the answer.

The model calls ``ask_user`` (a tool made by ``sk.ask_user``) and then ``book``, which
asks for a confirmation by raising ``sk.NeedsInput`` with a JSON Schema. Each question
pauses the run (reason ``input_required``, the question in the pause's metadata); a
later process, here a new kernel on the same SQLite file, answers it with
``kernel.resume(run_id, value=...)``: the answer is checked against the schema and
becomes the call's result. Run it with ``python examples/interactive_tools.py``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import statekernel as sk
from statekernel.errors import InvalidArgument
from statekernel.testing import ScriptedProvider, call

CONFIRM = {
    "type": "object",
    "properties": {"confirmed": {"type": "boolean"}},
    "required": ["confirmed"],
}


@sk.tool
def book(city: str, nights: int) -> str:
    """Book a hotel (asks the user to confirm first).

    Args:
        city: Where.
        nights: How many nights.
    """
    raise sk.NeedsInput(f"Book {nights} nights in {city}?", schema=CONFIRM)


def kernel(store: str) -> sk.Kernel:
    """A new process's kernel: same store, same tools."""
    model = ScriptedProvider(
        [
            call("ask_user", {"question": "Which city?"}),
            call("book", {"city": "Lisbon", "nights": 3}),
            "Booked 3 nights in Lisbon.",
        ]
    )
    return sk.Kernel(store, tools=[sk.ask_user(), book], providers={"scripted": model})


async def drive(store: str, run_id: str, answer: object) -> sk.Run:
    """Answer the waiting question in a fresh kernel and drive the run to rest."""
    async with kernel(store) as k:
        if answer is not None:
            await k.resume(run_id, value=answer)
        async for _ in k.run(run_id):
            pass
        return await k.get(run_id)


async def main(store: str) -> None:
    async with kernel(store) as k:
        run = await k.start(model="scripted/travel", messages=["Find me a hotel."])
    run = await drive(store, run.run_id, None)
    for answer in ("Lisbon", {"confirmed": "yes"}, {"confirmed": True}):
        assert run.pause is not None
        print(f"{run.pause.reason}: {run.pause.metadata['question']}")
        try:
            run = await drive(store, run.run_id, answer)
        except InvalidArgument as exc:
            print(f"refused {answer!r}: {exc}")
        else:
            print(f"answered {answer!r}: run {run.state}")
    print(run.messages[-1].text)


if __name__ == "__main__":
    folder = Path(tempfile.mkdtemp())
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{folder}/runs.db"))
