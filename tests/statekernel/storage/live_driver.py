"""A process that starts one run and drives it to its end, streaming its answer in small
text deltas, for the tests of readers of live events in another process.

Usage: python live_driver.py STORE_URL RUN_ID PIPE CHUNK [run|step]

The run's first turn calls ``hold``, which waits for a line on the named pipe ``PIPE``
(the test writes it once its reader listens); the second turn streams ``ANSWER`` in
deltas of ``CHUNK`` characters. Prints ``HOLDING`` once ``hold`` runs and ``DONE
<state> <live events published>`` at the end. With ``step`` the run is driven by
``Kernel.step`` calls, one commit at a time, instead of one ``Kernel.run``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import statekernel as sk
from statekernel.testing import Reply, ScriptedProvider, call

ANSWER = "".join(f"word {i}, " for i in range(150)) + "and the end."
"""The final answer, streamed in deltas."""


async def main(url: str, run_id: str, pipe: Path, chunk: int, mode: str) -> None:
    @sk.tool
    async def hold() -> str:
        """Wait for the test's line on the pipe."""
        print("HOLDING", flush=True)
        return (await asyncio.to_thread(pipe.read_text)).strip()

    provider = ScriptedProvider([call("hold", {}), Reply(text=ANSWER, chunk=chunk)])
    async with sk.Kernel(url, tools=[hold], providers={"scripted": provider}) as kernel:
        await kernel.start(model="scripted/live", messages=["go"], run_id=run_id)
        published = 0
        if mode == "step":
            while not (await kernel.get(run_id)).is_terminal:
                published += sum(not event.persisted for event in await kernel.step(run_id))
        else:
            async for event in kernel.run(run_id):
                published += not event.persisted
        print(f"DONE {(await kernel.get(run_id)).state} {published}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[5] if len(sys.argv) > 5 else "run"
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), mode))
