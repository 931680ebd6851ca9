"""A provider given a client of httpx or of httpx2 (a library of the httpx family whose
exceptions are classes of its own) maps and retries the failures of either alike, over
real sockets: a port that refuses, a server that hangs up, a stream cut off."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import httpx2
import pytest

from statekernel._records.messages import Message, ModelRequest
from statekernel.errors import BadRequest, ProviderUnavailable
from statekernel.providers import OpenAIProvider, RetryPolicy, complete
from statekernel.providers._errors import HTTPErrors

from .conftest import Sleeps, WireServer

OK_STREAM = [
    {"model": "m", "choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": None}]},
    {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
]
REQUEST = ModelRequest(model="openai/m", messages=[Message.user("hi")])

LIBRARIES: dict[str, Any] = {"httpx": httpx, "httpx2": httpx2}
"""Each library of the httpx family a provider's client may come from."""


@pytest.fixture(params=sorted(LIBRARIES))
def library(request: pytest.FixtureRequest) -> Any:
    """The module of the client under test: httpx, then httpx2."""
    return LIBRARIES[request.param]


@asynccontextmanager
async def provider_with(
    library: Any, base_url: str, sleeps: Sleeps, *, attempts: int = 3, read: float = 30.0
) -> AsyncIterator[OpenAIProvider]:
    """An OpenAI provider whose client is of ``library`` (it reads for up to ``read``
    seconds between parts)."""
    timeout = library.Timeout(10.0, read=read)
    async with library.AsyncClient(timeout=timeout) as client:
        retry = RetryPolicy(max_attempts=attempts)
        yield OpenAIProvider(base_url=base_url, client=client, sleep=sleeps, retry=retry)


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port bound and never listened on: each connection is refused (the
    socket stays bound meanwhile, so no other test's server takes the port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@asynccontextmanager
async def hanging_up() -> AsyncIterator[tuple[str, list[int]]]:
    """A server that reads each request and closes the connection without answering;
    yields its URL and the list it counts the requests in."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        seen.append(1)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


async def test_a_refused_connection_is_retried_then_unavailable(
    library: Any, sleeps: Sleeps
) -> None:
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}"
        async with provider_with(library, url, sleeps) as provider:
            with pytest.raises(ProviderUnavailable, match=r"cannot reach .*ConnectError") as info:
                await complete(provider, REQUEST)
    assert len(sleeps.delays) == 2  # three attempts
    assert isinstance(info.value.__cause__, library.ConnectError)


async def test_a_server_that_hangs_up_is_retried_then_unavailable(
    library: Any, sleeps: Sleeps
) -> None:
    async with hanging_up() as (url, seen), provider_with(library, url, sleeps) as provider:
        with pytest.raises(ProviderUnavailable, match="RemoteProtocolError") as info:
            await complete(provider, REQUEST)
    assert len(seen) == 3
    assert len(sleeps.delays) == 2
    assert isinstance(info.value.__cause__, library.RemoteProtocolError)


async def test_a_connection_dropped_before_any_output_is_retried(
    library: Any, wire: WireServer, sleeps: Sleeps
) -> None:
    wire.sse(OK_STREAM, done=True, drop_after=0)
    wire.sse(OK_STREAM, done=True)
    async with provider_with(library, wire.url, sleeps) as provider:
        assert (await complete(provider, REQUEST)).text == "fine"
    assert len(wire.requests) == 2
    assert len(sleeps.delays) == 1


async def test_a_connection_dropped_mid_stream_is_not_retried(
    library: Any, wire: WireServer, sleeps: Sleeps
) -> None:
    wire.sse([OK_STREAM[0], OK_STREAM[0], *OK_STREAM[1:]], done=True, drop_after=2)
    async with provider_with(library, wire.url, sleeps) as provider:
        with pytest.raises(ProviderUnavailable, match="already started"):
            await complete(provider, REQUEST)
    assert len(wire.requests) == 1
    assert sleeps.delays == []


async def test_a_server_silent_past_the_read_timeout_is_unavailable(
    library: Any, wire: WireServer, sleeps: Sleeps
) -> None:
    wire.sse(OK_STREAM, done=True, delay=120.0)  # ends as soon as the client hangs up
    async with provider_with(library, wire.url, sleeps, attempts=1, read=0.2) as provider:
        with pytest.raises(ProviderUnavailable, match="timed out") as info:
            await complete(provider, REQUEST)
    assert isinstance(info.value.__cause__, library.ReadTimeout)


async def test_a_url_no_client_can_send_is_a_bad_request(library: Any, sleeps: Sleeps) -> None:
    async with provider_with(library, "ftp://127.0.0.1/v1", sleeps) as provider:
        with pytest.raises(BadRequest, match="openai: "):
            await complete(provider, REQUEST)
    assert sleeps.delays == []  # not retried


async def test_a_reply_that_is_no_event_stream_is_retried_with_either_client(
    library: Any, wire: WireServer, sleeps: Sleeps
) -> None:
    """httpx-sse raises httpx's own error whatever the client's library."""
    for _ in range(3):
        wire.reply(200, b"<html>captive portal</html>", headers={"content-type": "text/html"})
    async with provider_with(library, wire.url, sleeps) as provider:
        with pytest.raises(ProviderUnavailable, match="text/event-stream"):
            await complete(provider, REQUEST)
    assert len(wire.requests) == 3


class OwnClient(httpx2.AsyncClient):
    """A client class of an application, built on httpx2's."""


@pytest.mark.parametrize(
    ("make", "libraries"),
    [
        (httpx.AsyncClient, [httpx]),
        (httpx2.AsyncClient, [httpx, httpx2]),
        (OwnClient, [httpx, httpx2]),
    ],
)
async def test_the_errors_of_a_client_are_httpxs_and_its_librarys(
    make: Callable[[], Any], libraries: list[Any]
) -> None:
    client = make()
    try:
        errors = HTTPErrors.of(client)
    finally:
        await client.aclose()
    assert errors.http == tuple(library.HTTPError for library in libraries)
    assert errors.timeout == tuple(library.TimeoutException for library in libraries)
    assert set(errors.unreachable) == {
        cls for library in libraries for cls in (library.ConnectError, library.ConnectTimeout)
    }
