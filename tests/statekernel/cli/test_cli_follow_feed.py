"""``runs events --follow`` on a store with a feed of commit notices (PostgreSQL, Redis):
new events are printed when the commit's notice comes, not at the next look (the look
here is an hour away)."""

from __future__ import annotations

import asyncio
import json
import os
from asyncio.subprocess import PIPE

import statekernel as sk
from statekernel.testing import ScriptedProvider

from .test_cli_runs import EXE


async def test_follow_prints_each_commit_when_its_notice_comes(feed_store_url: str) -> None:
    provider = ScriptedProvider(["done"])
    async with sk.Kernel(feed_store_url, providers={"scripted": provider}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["go"], run_id="followed")
        while not await kernel.events(run.run_id):
            await kernel.step(run.run_id)  # an event to print: the follower listens once printed
        env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
        command = ["runs", "events", run.run_id, "-f", "--interval", "3600", "--json"]
        follow = await asyncio.create_subprocess_exec(
            str(EXE), *command, "--store", feed_store_url, env=env, stdout=PIPE
        )
        try:
            assert follow.stdout is not None
            first = await asyncio.wait_for(follow.stdout.readline(), 120)  # it listens by now
            assert json.loads(first)["revision"] == 1
            async for _ in kernel.run(run.run_id):
                pass
            rest, _ = await asyncio.wait_for(follow.communicate(), 120)
        finally:
            if follow.returncode is None:
                follow.kill()
                await follow.wait()
    assert follow.returncode == 0
    types = [json.loads(line)["type"] for line in rest.decode().splitlines()]
    assert types[-1] == "run_completed"
    assert "model_completed" in types
