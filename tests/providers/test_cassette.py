"""Record/replay: a cassette records any provider's parts and replays them exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statekernel._records.messages import Message, ModelRequest, ToolSpec
from statekernel.errors import BadRequest, ConfigError, RateLimited
from statekernel.providers import ModelProvider, OpenAIProvider, StreamPart, complete
from statekernel.testing import Cassette, Fail, Reply, ScriptedProvider, call, request_key

from .conftest import WireServer

REQUEST = ModelRequest(
    model="openai/m",
    messages=[Message.user("Weather in Paris?")],
    tools=[ToolSpec("get_weather")],
)


async def parts_of(provider: ModelProvider, request: ModelRequest = REQUEST) -> list[StreamPart]:
    return [part async for part in provider.stream(request)]


async def test_records_then_replays_exactly(tmp_path: Path) -> None:
    path = tmp_path / "cassettes" / "weather.json"
    script = ScriptedProvider(
        [
            Reply(
                text="Checking.",
                reasoning="hm",
                tool_calls=[call("get_weather", {"c": 1})],
                chunk=3,
            )
        ]
    )
    recorder = Cassette(path, script)
    recorded = await parts_of(recorder)
    assert recorder.recorded == 1
    assert path.exists()

    replayer = Cassette(path, mode="replay")
    assert await parts_of(replayer) == recorded
    assert replayer.replayed == 1
    assert len(script.requests) == 1


async def test_identical_requests_replay_in_order(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    script = ScriptedProvider(["never asked"])
    recorder = Cassette(path, ScriptedProvider(["first", "unused"]))
    await parts_of(recorder)
    recorder.provider = ScriptedProvider(["second"])
    await parts_of(recorder)
    replayer = Cassette(path, script, mode="replay")
    assert (await complete(replayer, REQUEST)).text == "first"
    assert (await complete(replayer, REQUEST)).text == "second"
    with pytest.raises(BadRequest, match="no recording for request"):
        await complete(replayer, REQUEST)
    assert script.requests == []


async def test_auto_mode_records_only_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    await complete(Cassette(path, ScriptedProvider(["one"])), REQUEST)
    other = ModelRequest(model="openai/m", messages=[Message.user("Something else")])
    script = ScriptedProvider(["two"])
    cassette = Cassette(path, script)
    assert (await complete(cassette, REQUEST)).text == "one"
    assert (await complete(cassette, other)).text == "two"
    assert len(script.requests) == 1
    assert len(json.loads(path.read_text())["recordings"]) == 2


async def test_record_mode_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    await complete(Cassette(path, ScriptedProvider(["old"])), REQUEST)
    await complete(Cassette(path, ScriptedProvider(["new"]), mode="record"), REQUEST)
    assert (await complete(Cassette(path, mode="replay"), REQUEST)).text == "new"


async def test_errors_are_recorded_and_raised_again(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    failing = ScriptedProvider([Fail(RateLimited("slow down", retry_after=3.0))])
    with pytest.raises(RateLimited):
        await complete(Cassette(path, failing), REQUEST)
    with pytest.raises(RateLimited, match="slow down") as info:
        await complete(Cassette(path, mode="replay"), REQUEST)
    assert info.value.retry_after == 3.0


async def test_real_http_stream_recorded_and_replayed_offline(
    tmp_path: Path, wire: WireServer
) -> None:
    chunks = [
        {"model": "m", "choices": [{"index": 0, "delta": {"content": "Sunny"}}]},
        {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    wire.sse(chunks, done=True)
    path = tmp_path / "c.json"
    provider = OpenAIProvider(base_url=wire.url, api_key="sk-cassette-secret")
    live = await parts_of(Cassette(path, provider))
    await provider.aclose()
    await wire.stop()
    assert await parts_of(Cassette(path, mode="replay")) == live
    assert "sk-cassette-secret" not in path.read_text()


def test_request_key_is_stable_and_sensitive() -> None:
    same = ModelRequest(
        model="openai/m",
        messages=[Message.user("Weather in Paris?")],
        tools=[ToolSpec("get_weather")],
    )
    assert request_key(same) == request_key(REQUEST)
    assert request_key(ModelRequest(model="openai/m", temperature=0.5)) != request_key(
        ModelRequest(model="openai/m", temperature=0.6)
    )


def test_bad_files_and_modes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not a valid cassette"):
        Cassette(bad)
    with pytest.raises(ConfigError, match="needs a provider"):
        Cassette(tmp_path / "x.json", mode="record")
    with pytest.raises(ConfigError, match="mode"):
        Cassette(tmp_path / "x.json", mode="rewind")  # type: ignore[arg-type]
