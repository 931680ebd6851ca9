"""Model fallback chains over real HTTP providers (the OpenAI and Anthropic wire formats):
the next model of the chain answers after a 503, a 429 once the provider's retries are
spent, or a refusal; the turn records the model that answered; the chain is stored with
the run and used by another kernel that resumes it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument
from statekernel.providers import AnthropicProvider, OpenAIProvider, RetryPolicy
from statekernel.telemetry import Price

from .conftest import Sleeps, WireServer

CALLS: list[str] = []


@sk.tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    CALLS.append(city)
    return "sunny"


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` as the API streams it."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "model": "gpt-4o", "choices": choices, **extra}


def openai_usage(prompt: int, completion: int) -> dict[str, Any]:
    counts = {"prompt_tokens": prompt, "completion_tokens": completion}
    return chunk(None, usage={**counts, "total_tokens": prompt + completion})


def anthropic_answer(
    wire: WireServer, text: str, stop_reason: str = "end_turn", tokens: tuple[int, int] = (9, 4)
) -> None:
    """A streamed Messages API answer (``text``, ended with ``stop_reason``)."""
    message: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-sonnet-4",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": tokens[0], "output_tokens": 1},
    }
    wire.sse(
        [
            ("message_start", {"type": "message_start", "message": message}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": tokens[1]},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    )


UNAVAILABLE = {"error": {"message": "The server is overloaded", "type": "server_error"}}
RATE_LIMITED = {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}
CHAIN = ("openai/gpt-4o", "anthropic/claude-sonnet-4")


@pytest.fixture
async def other_wire() -> AsyncIterator[WireServer]:
    """A second vendor's server."""
    server = WireServer()
    await server.start()
    yield server
    await server.stop()


def providers(openai: WireServer, anthropic: WireServer, attempts: int = 1) -> dict[str, Any]:
    retry = RetryPolicy(max_attempts=attempts)
    return {
        "openai": OpenAIProvider(base_url=openai.url, retry=retry, sleep=Sleeps()),
        "anthropic": AnthropicProvider(base_url=anthropic.url, retry=retry, sleep=Sleeps()),
    }


async def drive(kernel: sk.Kernel, run_id: str) -> tuple[list[sk.Event], sk.Run]:
    events = [event async for event in kernel.run(run_id)]
    return events, await kernel.get(run_id)


async def test_after_a_503_the_next_model_answers_and_the_turn_records_it(
    wire: WireServer, other_wire: WireServer
) -> None:
    wire.json(UNAVAILABLE, status=503)
    anthropic_answer(other_wire, "Bonjour.")
    async with sk.Kernel("memory://", providers=providers(wire, other_wire)) as kernel:
        run = await kernel.start(model=sk.Fallback(*CHAIN), messages=["Say hello in French."])
        assert run.model == "openai/gpt-4o"
        assert run.fallback == sk.Fallback(*CHAIN)
        events, done = await drive(kernel, run.run_id)

    assert done.state == "completed"
    assert done.output == "Bonjour."
    (turn,) = done.turns
    assert turn.request.model == "openai/gpt-4o"  # what was asked
    assert turn.model == "anthropic/claude-sonnet-4"  # who answered
    assert turn.answered_by == "anthropic/claude-sonnet-4"
    assert len(wire.requests) == 1
    assert len(other_wire.requests) == 1
    sent = other_wire.requests[0].json()
    assert sent["model"] == "claude-sonnet-4"
    assert sent["messages"][0]["content"][0]["text"] == "Say hello in French."
    completed = next(e for e in events if e.type == "model_completed")
    assert completed.data["model"] == "anthropic/claude-sonnet-4"


async def test_a_429_falls_back_only_once_the_providers_retries_are_spent(
    wire: WireServer, other_wire: WireServer
) -> None:
    for _ in range(2):
        wire.json(RATE_LIMITED, status=429)
    anthropic_answer(other_wire, "Hello.")
    chain = sk.Fallback(*CHAIN, on=("rate_limited",))
    async with sk.Kernel("memory://", providers=providers(wire, other_wire, attempts=2)) as k:
        run = await k.start(model=chain, messages=["Hi"])
        _, done = await drive(k, run.run_id)

    assert done.state == "completed"
    assert len(wire.requests) == 2  # the provider's own retry first
    assert done.turns[0].model == "anthropic/claude-sonnet-4"


async def test_a_refusal_falls_back_when_the_chain_lists_it_and_its_usage_is_counted(
    wire: WireServer, other_wire: WireServer
) -> None:
    wire.sse(
        [
            chunk({"role": "assistant", "refusal": ""}),
            chunk({"refusal": "I can't help with that."}),
            chunk({}, "stop"),
            openai_usage(12, 6),
        ]
    )
    anthropic_answer(other_wire, "Here it is.", tokens=(9, 4))
    chain = sk.Fallback(*CHAIN, on=("refused",))
    async with sk.Kernel("memory://", providers=providers(wire, other_wire)) as kernel:
        run = await kernel.start(model=chain, messages=["Tell me."])
        events, done = await drive(kernel, run.run_id)

    assert done.state == "completed"
    assert done.output == "Here it is."  # the refusal never reached the transcript
    assert [m.role for m in done.messages] == ["user", "assistant"]
    assert done.turns[0].model == "anthropic/claude-sonnet-4"
    assert done.usage == sk.Usage(21, 10)  # the refused answer was paid for too
    # streamed text of the refused answer was shown live, then the answer that replaced it
    deltas = [e.data["text"] for e in events if e.type == "text_delta"]
    assert deltas == ["I can't help with that.", "Here it is."]


async def test_each_model_of_a_chain_prices_its_own_answer(
    wire: WireServer, other_wire: WireServer
) -> None:
    wire.sse([chunk({"refusal": "No."}), chunk({}, "stop"), openai_usage(1_000_000, 0)])
    anthropic_answer(other_wire, "Yes.", tokens=(1_000_000, 1_000_000))
    prices = {
        "openai/gpt-4o": Price(input_per_mtok=2.5, output_per_mtok=10.0),
        "anthropic/claude-sonnet-4": Price(input_per_mtok=3.0, output_per_mtok=15.0),
    }
    chain = sk.Fallback(*CHAIN, on=("refused",))
    kernel = sk.Kernel("memory://", providers=providers(wire, other_wire), prices=prices)
    async with kernel:
        run = await kernel.start(model=chain, messages=["Tell me."], limits=sk.Limits(cost=100))
        _, done = await drive(kernel, run.run_id)
    assert done.state == "completed"
    assert done.usage.cost == pytest.approx(2.5 + 3.0 + 15.0)  # the refusal at its own price


async def test_a_refusal_is_the_answer_when_the_chain_does_not_list_it(
    wire: WireServer, other_wire: WireServer
) -> None:
    wire.sse([chunk({"refusal": "No."}), chunk({}, "stop"), openai_usage(3, 1)])
    async with sk.Kernel("memory://", providers=providers(wire, other_wire)) as kernel:
        run = await kernel.start(model=sk.Fallback(*CHAIN), messages=["Tell me."])
        _, done = await drive(kernel, run.run_id)

    assert done.state == "completed"
    assert done.output == "No."
    assert done.turns[0].model is None
    assert done.turns[0].answered_by == "openai/gpt-4o"
    assert other_wire.requests == []


async def test_an_error_the_chain_does_not_list_fails_the_run(
    wire: WireServer, other_wire: WireServer
) -> None:
    wire.json({"error": {"message": "bad", "type": "invalid_request_error"}}, status=400)
    async with sk.Kernel("memory://", providers=providers(wire, other_wire)) as kernel:
        run = await kernel.start(model=sk.Fallback(*CHAIN), messages=["Hi"])
        _, done = await drive(kernel, run.run_id)

    assert done.state == "failed"
    assert done.failure is not None
    assert done.failure.error == "BadRequest"
    assert other_wire.requests == []


async def test_when_every_model_fails_the_last_failure_fails_the_run(
    wire: WireServer, other_wire: WireServer
) -> None:
    wire.json(UNAVAILABLE, status=503)
    other_wire.json({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}, 529)
    async with sk.Kernel("memory://", providers=providers(wire, other_wire)) as kernel:
        run = await kernel.start(model=sk.Fallback(*CHAIN), messages=["Hi"])
        _, done = await drive(kernel, run.run_id)

    assert done.state == "failed"
    assert done.failure is not None
    assert done.failure.error == "ProviderUnavailable"
    assert "anthropic" in done.failure.message


def tool_call_answer(wire: WireServer, city: str) -> None:
    arguments = json.dumps({"city": city})
    call = {"index": 0, "id": f"call_{city}", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    wire.sse([chunk({"tool_calls": [call]}), chunk({}, "tool_calls"), openai_usage(5, 5)])


async def test_the_chain_is_stored_and_used_by_another_kernel_that_resumes_the_run(
    tmp_path: Path, wire: WireServer, other_wire: WireServer
) -> None:
    CALLS.clear()
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    tool_call_answer(wire, "Paris")
    chain = sk.Fallback(*CHAIN, on=("unavailable", "refused"))
    first = providers(wire, other_wire)
    async with sk.Kernel(store, tools=[get_weather], providers=first) as kernel:
        run = await kernel.start(
            model=chain, messages=["Weather in Paris?"], limits=sk.Limits(tool_calls=0)
        )
        _, paused = await drive(kernel, run.run_id)
    assert paused.pause is not None
    assert paused.pause.reason == "limit_reached"
    assert paused.turns == ()
    assert paused.current_turn is not None
    assert paused.current_turn.model is None  # the first model answered this turn
    assert CALLS == []

    wire.json(UNAVAILABLE, status=503)  # the second turn's first model is down
    anthropic_answer(other_wire, "Sunny in Paris.")
    second = providers(wire, other_wire)
    async with sk.Kernel(store, tools=[get_weather], providers=second) as kernel:
        loaded = await kernel.get(run.run_id)
        assert loaded.fallback == chain
        assert loaded.limits == sk.Limits(tool_calls=0)
        await kernel.resume(run.run_id, limits=sk.Limits(tool_calls=1))
        _, done = await drive(kernel, run.run_id)

    assert done.state == "completed"
    assert CALLS == ["Paris"]
    assert [t.answered_by for t in done.turns] == list(CHAIN)
    assert len(wire.requests) == 2
    assert len(other_wire.requests) == 1
    sent = other_wire.requests[0].json()["messages"]
    assert sent[-1]["content"][0]["type"] == "tool_result"  # the whole transcript went over


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: sk.Fallback("openai/gpt-4o"), "at least two models"),
        (lambda: sk.Fallback("openai/gpt-4o", "openai/gpt-4o"), "twice"),
        (lambda: sk.Fallback("openai/gpt-4o", "claude"), "provider/name"),
        (lambda: sk.Fallback("openai/gpt-4o", 3), "must be a str"),  # type: ignore[arg-type]
        (lambda: sk.Fallback(*CHAIN, on=("offline",)), "offline"),  # type: ignore[arg-type]
        (lambda: sk.Fallback(*CHAIN, on="refused"), "tuple of kinds"),  # type: ignore[arg-type]
        (lambda: sk.Fallback(*CHAIN, on=()), "at least one"),
    ],
)
def test_a_bad_chain_is_refused_naming_what_is_wrong(make: Any, named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        make()


async def test_a_chain_with_a_model_whose_provider_is_unknown_creates_no_run(
    wire: WireServer,
) -> None:
    only_openai = {"openai": OpenAIProvider(base_url=wire.url)}
    async with sk.Kernel("memory://", providers=only_openai) as kernel:
        with pytest.raises(sk.errors.ConfigError, match="nowhere"):
            await kernel.start(model=sk.Fallback("openai/gpt-4o", "nowhere/m"), run_id="r1")
        with pytest.raises(sk.RunNotFound):
            await kernel.get("r1")


async def test_an_anthropic_refusal_stop_reason_falls_back_to_the_next_model(
    wire: WireServer, other_wire: WireServer
) -> None:
    anthropic_answer(other_wire, "I won't.", stop_reason="refusal", tokens=(7, 2))
    wire.sse([chunk({"content": "Sure."}), chunk({}, "stop"), openai_usage(4, 1)])
    chain = sk.Fallback("anthropic/claude-sonnet-4", "openai/gpt-4o", on=("refused",))
    async with sk.Kernel("memory://", providers=providers(wire, other_wire)) as kernel:
        run = await kernel.start(model=chain, messages=["Please."])
        _, done = await drive(kernel, run.run_id)

    assert done.state == "completed"
    assert done.output == "Sure."
    assert done.turns[0].model == "openai/gpt-4o"
    assert done.usage == sk.Usage(11, 3)
