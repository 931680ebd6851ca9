"""A process that starts one run on a store and drives it to its end, for the tests of
readers that follow a run from another process.

Usage: python follow_driver.py STORE_URL RUN_ID PIPE

The run's first turn calls ``hold``, which waits for a line on the named pipe ``PIPE``
(the test writes it when it wants the run to go on); the second turn answers. Prints
``STARTED`` once the run is stored, ``HOLDING`` once ``hold`` runs (its call is
committed, and nothing more is until the test writes), and ``DONE <state>`` at the end.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


async def main(url: str, run_id: str, pipe: Path) -> None:
    @sk.tool
    async def hold() -> str:
        """Wait for the test's line on the pipe."""
        print("HOLDING", flush=True)
        return (await asyncio.to_thread(pipe.read_text)).strip()

    provider = ScriptedProvider([call("hold", {}), "all done"])
    async with sk.Kernel(url, tools=[hold], providers={"scripted": provider}) as kernel:
        await kernel.start(model="scripted/follow", messages=["go"], run_id=run_id)
        print("STARTED", flush=True)
        async for _ in kernel.run(run_id):
            pass
        print(f"DONE {(await kernel.get(run_id)).state}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
