"""A recognisable API key used for real HTTP calls never reaches a stored byte or an event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.providers import OpenAIProvider

from .conftest import WireServer

KEY = "sk-proj-RECOGNISABLE-KEY-4f1d2c"


@sk.tool
def echo(text: str) -> str:
    """Return the text."""
    return text


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@pytest.mark.parametrize("scheme", ["file", "sqlite"])
async def test_key_in_no_stored_byte_and_no_event(
    tmp_path: Path, wire: WireServer, scheme: str
) -> None:
    store = f"file://{tmp_path}/runs" if scheme == "file" else f"sqlite:///{tmp_path}/runs.db"
    tool_call = {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "echo", "arguments": '{"text": "hi"}'}}  # fmt: skip
    wire.sse([chunk({"tool_calls": [tool_call]}), chunk({}, "tool_calls")], done=True)
    wire.sse([chunk({"content": "done"}), chunk({}, "stop")], done=True)
    wire.json(
        {"error": {"message": f"Incorrect API key provided: {KEY}.", "code": "invalid_api_key"}},
        status=401,
    )
    provider = OpenAIProvider(base_url=wire.url, api_key=KEY)
    events = []
    async with sk.Kernel(store, tools=[echo], providers={"openai": provider}) as kernel:
        ok = await kernel.start(model="openai/m", messages=["say hi"])
        events += [e async for e in kernel.run(ok.run_id)]
        failing = await kernel.start(model="openai/m", messages=["again"])
        events += [e async for e in kernel.run(failing.run_id)]
        assert (await kernel.get(ok.run_id)).state == "completed"
        failed = await kernel.get(failing.run_id)
    await provider.aclose()

    assert failed.state == "failed"
    assert failed.failure is not None
    assert "Incorrect API key provided: ***" in failed.failure.message
    assert wire.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was really used
    for event in events:
        assert KEY not in json.dumps(event.data, default=str)
    stored = [p for p in tmp_path.rglob("*") if p.is_file()]  # noqa: ASYNC240 - a test scan
    assert stored
    for path in stored:
        assert KEY.encode() not in path.read_bytes(), path
