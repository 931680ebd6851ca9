"""Failures over real HTTP: each ends in the right retry count or typed error."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from statekernel._records.messages import Message, ModelRequest
from statekernel.errors import (
    AuthenticationFailed,
    BadRequest,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)
from statekernel.providers import (
    AnthropicProvider,
    HTTPProvider,
    OllamaProvider,
    OpenAIProvider,
    RetryPolicy,
    StreamPart,
    complete,
)
from statekernel.providers._errors import retry_after_seconds

from .conftest import Sleeps, WireServer

OK_STREAM = [
    {"model": "m", "choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": None}]},
    {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
]
HTML_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
REQUEST = ModelRequest(model="openai/m", messages=[Message.user("hi")])


@pytest.fixture
async def provider(
    wire: WireServer, sleeps: Sleeps, fast_retry: RetryPolicy
) -> AsyncIterator[OpenAIProvider]:
    p = OpenAIProvider(
        base_url=wire.url, api_key="sk-abc", sleep=sleeps, retry=fast_retry, rng=random.Random(1)
    )
    yield p
    await p.aclose()


async def test_401_is_not_retried(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.json({"error": {"message": "Invalid token", "type": "invalid_request_error"}}, 401)
    with pytest.raises(AuthenticationFailed, match="HTTP 401 invalid_request_error: Invalid token"):
        await complete(provider, REQUEST)
    assert len(wire.requests) == 1
    assert sleeps.delays == []


async def test_400_carries_the_vendor_message(wire: WireServer, provider: OpenAIProvider) -> None:
    message = "Invalid value for 'temperature': must be between 0 and 2."
    wire.json({"error": {"message": message, "type": "invalid_request_error", "param": "t"}}, 400)
    with pytest.raises(BadRequest) as info:
        await complete(provider, REQUEST)
    assert message in str(info.value)
    assert info.value.status == 400
    assert info.value.provider == "openai"
    assert len(wire.requests) == 1


async def test_429_honours_retry_after(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.json(
        {"error": {"message": "Rate limit reached", "type": "requests"}},
        429,
        headers={"retry-after": "7"},
    )
    wire.sse(OK_STREAM, done=True)
    result = await complete(provider, REQUEST)
    assert result.text == "fine"
    assert sleeps.delays == [7.0]
    assert len(wire.requests) == 2


async def test_429_retry_after_ms_and_http_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    headers = httpx.Headers({"retry-after": format_datetime(now + timedelta(seconds=30))})
    assert retry_after_seconds(headers, clock=now.timestamp) == 30.0
    headers = httpx.Headers({"retry-after-ms": "1500", "retry-after": "9"})
    assert retry_after_seconds(headers, clock=now.timestamp) == 1.5
    assert retry_after_seconds(httpx.Headers({"retry-after": "soon"}), clock=now.timestamp) is None


async def test_429_with_a_long_retry_after_is_raised(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.json({"error": {"message": "quota"}}, 429, headers={"retry-after": "3600"})
    with pytest.raises(RateLimited) as info:
        await complete(provider, REQUEST)
    assert info.value.retry_after == 3600.0
    assert sleeps.delays == []


async def test_429_gives_up_after_max_attempts(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    for _ in range(3):
        wire.json({"error": {"message": "slow down"}}, 429, headers={"retry-after": "1"})
    with pytest.raises(RateLimited, match="slow down"):
        await complete(provider, REQUEST)
    assert len(wire.requests) == 3
    assert sleeps.delays == [1.0, 1.0]


async def test_html_502_is_retried_with_backoff_then_raised(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    for _ in range(3):
        wire.reply(502, HTML_502, headers={"content-type": "text/html"})
    with pytest.raises(ProviderUnavailable, match="HTTP 502: HTML error page: 502 Bad Gateway"):
        await complete(provider, REQUEST)
    assert len(wire.requests) == 3
    first, second = sleeps.delays
    assert 0.375 <= first <= 0.5  # 0.5 less up to 25 % jitter
    assert 0.75 <= second <= 1.0


async def test_non_json_error_body(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.reply(500, b"upstream exploded", headers={"content-type": "text/plain"})
    wire.sse(OK_STREAM, done=True)
    assert (await complete(provider, REQUEST)).text == "fine"
    assert len(sleeps.delays) == 1
    wire.reply(418, b"I'm a teapot", headers={"content-type": "text/plain"})
    with pytest.raises(BadRequest, match="HTTP 418: I'm a teapot"):
        await complete(provider, REQUEST)


async def test_a_2xx_answer_that_is_no_event_stream(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    for _ in range(3):
        wire.reply(200, b"<html>captive portal</html>", headers={"content-type": "text/html"})
    with pytest.raises(ProviderUnavailable, match="text/event-stream"):
        await complete(provider, REQUEST)
    assert len(wire.requests) == 3


async def test_stream_usage_can_be_left_out(wire: WireServer) -> None:
    provider = OpenAIProvider(base_url=wire.url, stream_usage=False)
    wire.sse(OK_STREAM, done=True)
    await complete(provider, REQUEST)
    assert "stream_options" not in wire.requests[0].json()
    await provider.aclose()


async def test_connection_dropped_mid_stream_is_not_retried(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.sse([*OK_STREAM[:1], *OK_STREAM[:1], *OK_STREAM[1:]], done=True, drop_after=2)
    parts: list[StreamPart] = []
    with pytest.raises(ProviderUnavailable, match="already started"):
        await drain(provider.stream(REQUEST), parts)
    assert len(parts) == 2
    assert len(wire.requests) == 1
    assert sleeps.delays == []


async def test_connection_dropped_before_any_output_is_retried(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.sse(OK_STREAM, done=True, drop_after=0)
    wire.sse(OK_STREAM, done=True)
    assert (await complete(provider, REQUEST)).text == "fine"
    assert len(wire.requests) == 2
    assert len(sleeps.delays) == 1


async def test_connection_refused(sleeps: Sleeps) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = OpenAIProvider(
        base_url=f"http://127.0.0.1:{port}", sleep=sleeps, retry=RetryPolicy(max_attempts=2)
    )
    with pytest.raises(ProviderUnavailable, match="ConnectError"):
        await complete(provider, REQUEST)
    assert len(sleeps.delays) == 1
    await provider.aclose()


async def test_read_timeout_between_chunks(wire: WireServer, sleeps: Sleeps) -> None:
    provider = OpenAIProvider(
        base_url=wire.url,
        sleep=sleeps,
        timeout=httpx.Timeout(1.0, read=0.2),
        retry=RetryPolicy(max_attempts=1),
    )
    wire.sse(OK_STREAM, done=True, delay=1.0)
    with pytest.raises(ProviderUnavailable, match="timed out"):
        await complete(provider, REQUEST)
    await provider.aclose()


async def test_cancellation_closes_the_stream(wire: WireServer, provider: OpenAIProvider) -> None:
    wire.sse([OK_STREAM[0]] * 50, done=True, delay=0.05)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in provider.stream(REQUEST):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(wire.disconnected.wait(), 5)


async def test_breaking_out_early_closes_the_stream(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    wire.sse([OK_STREAM[0]] * 50, done=True, delay=0.05)
    stream = provider.stream(REQUEST)
    async for _ in stream:
        break
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(wire.disconnected.wait(), 5)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, AuthenticationFailed),
        (403, AuthenticationFailed),
        (400, BadRequest),
        (404, BadRequest),
        (422, BadRequest),
        (429, RateLimited),
        (500, ProviderUnavailable),
        (503, ProviderUnavailable),
        (529, ProviderUnavailable),
    ],
)
@pytest.mark.parametrize("vendor", ["openai", "anthropic", "ollama"])
async def test_status_mapping_for_every_provider(
    wire: WireServer, sleeps: Sleeps, vendor: str, status: int, error: type[ProviderError]
) -> None:
    retry = RetryPolicy(max_attempts=1)
    makers: dict[str, Callable[[], HTTPProvider]] = {
        "openai": lambda: OpenAIProvider(base_url=wire.url, sleep=sleeps, retry=retry),
        "anthropic": lambda: AnthropicProvider(base_url=wire.url, sleep=sleeps, retry=retry),
        "ollama": lambda: OllamaProvider(host=wire.url, sleep=sleeps, retry=retry),
    }
    provider = makers[vendor]()
    wire.json({"type": "error", "error": {"type": "x", "message": "vendor says no"}}, status)
    with pytest.raises(error, match="vendor says no") as info:
        await complete(provider, ModelRequest(model=f"{vendor}/m", messages=[Message.user("x")]))
    assert info.value.status == status
    assert info.value.provider == vendor
    await provider.aclose()


async def test_injected_client_is_shared_and_left_open(wire: WireServer) -> None:
    async with httpx.AsyncClient() as client:
        provider = OpenAIProvider(base_url=wire.url, client=client)
        wire.sse(OK_STREAM, done=True)
        await complete(provider, REQUEST)
        await provider.aclose()
        assert not client.is_closed


def test_retry_policy_backoff_is_bounded() -> None:
    policy = RetryPolicy(max_attempts=10, initial_delay=1.0, max_delay=8.0, jitter=0.0)
    error = ProviderUnavailable("x")
    rng = random.Random(0)
    assert [policy.delay(n, error, rng) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert policy.delay(10, error, rng) is None
    assert policy.delay(1, BadRequest("x"), rng) is None


async def drain(stream: AsyncIterator[StreamPart], parts: list[StreamPart]) -> None:
    async for part in stream:
        parts.append(part)


async def test_an_unreachable_server_is_named_with_the_variable_that_sets_it(
    sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("GROQ_API_KEY", "k")
    monkeypatch.setenv("GROQ_BASE_URL", f"http://127.0.0.1:{port}/v1")
    from statekernel.providers import ProviderRegistry

    registry = ProviderRegistry()
    provider = registry.get("groq/llama")
    provider.retry = RetryPolicy(max_attempts=1)  # type: ignore[attr-defined]
    try:
        with pytest.raises(ProviderUnavailable) as info:
            await complete(provider, REQUEST)
        said = f"groq: cannot reach http://127.0.0.1:{port}/v1 (set by GROQ_BASE_URL or base_url=)"
        assert str(info.value).startswith(said)
    finally:
        await registry.aclose()
