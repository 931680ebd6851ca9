"""A scripted HTTP/1.1 server on a real loopback socket, replaying vendors' wire formats.

Each request pops the next scripted reply: status, headers, a body sent as chunked
transfer encoding in the given pieces, optionally cut off mid-body (the connection is
dropped without the final chunk) or delayed.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

import attrs
import pytest

from statekernel.providers import RetryPolicy


@attrs.define
class Reply:
    status: int = 200
    chunks: list[bytes] = attrs.Factory(list)
    headers: dict[str, str] = attrs.Factory(dict)
    drop_after: int | None = None  # close the socket after this many chunks
    delay: float = 0.0  # seconds before each chunk
    split: int | None = None  # write each chunk in slices of this many bytes


@attrs.define
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class WireServer:
    """Serves scripted replies in order; records every request it receives."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.disconnected = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- scripting ----------------------------------------------------------------------

    def reply(self, status: int = 200, body: bytes | Iterable[bytes] = b"", **kw: Any) -> Reply:
        chunks = [body] if isinstance(body, bytes) else list(body)
        reply = Reply(status, chunks, **kw)
        self.replies.append(reply)
        return reply

    def json(self, data: Any, status: int = 200, **kw: Any) -> Reply:
        headers = {"content-type": "application/json", **kw.pop("headers", {})}
        return self.reply(status, json.dumps(data).encode(), headers=headers, **kw)

    def sse(self, events: Iterable[Any], *, done: bool = False, **kw: Any) -> Reply:
        """One chunk per event; an event is a dict (data only) or ``(name, dict)``."""
        chunks = []
        for event in events:
            name, data = event if isinstance(event, tuple) else (None, event)
            text = data if isinstance(data, str) else json.dumps(data)
            head = f"event: {name}\n" if name else ""
            chunks.append(f"{head}data: {text}\n\n".encode())
        if done:
            chunks.append(b"data: [DONE]\n\n")
        headers = {"content-type": "text/event-stream; charset=utf-8", **kw.pop("headers", {})}
        return self.reply(200, chunks, headers=headers, **kw)

    def ndjson(self, lines: Iterable[Any], **kw: Any) -> Reply:
        chunks = [json.dumps(line).encode() + b"\n" for line in lines]
        headers = {"content-type": "application/x-ndjson", **kw.pop("headers", {})}
        return self.reply(200, chunks, headers=headers, **kw)

    # -- serving ------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected.set()
        finally:
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Seen(method, path, headers, body))
        reply = self.replies.popleft() if self.replies else Reply(599, [b"no reply scripted"])
        status_line = f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}\r\n"
        out_headers = {"transfer-encoding": "chunked", "connection": "close", **reply.headers}
        head_out = status_line + "".join(f"{k}: {v}\r\n" for k, v in out_headers.items())
        writer.write(head_out.encode("latin-1") + b"\r\n")
        await writer.drain()
        for index, chunk in enumerate(reply.chunks):
            if reply.drop_after is not None and index >= reply.drop_after:
                writer.transport.abort()
                return
            if reply.delay and await _client_closed(reader, reply.delay):
                self.disconnected.set()
                return
            for piece in _slices(chunk, reply.split):
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
        if reply.drop_after is not None and reply.drop_after >= len(reply.chunks):
            writer.transport.abort()
            return
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await _client_closed(reader, 0.05)  # let the client close first


async def _client_closed(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Wait ``seconds``; True as soon as the client closes its end."""
    try:
        data = await asyncio.wait_for(reader.read(1), timeout=seconds)
    except TimeoutError:
        return False
    return data == b""


def _slices(chunk: bytes, size: int | None) -> list[bytes]:
    if not chunk:
        return []
    if not size:
        return [chunk]
    return [chunk[i : i + size] for i in range(0, len(chunk), size)]


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}


@pytest.fixture
async def wire() -> AsyncIterator[WireServer]:
    server = WireServer()
    await server.start()
    yield server
    await server.stop()


class Sleeps:
    """A ``sleep=`` replacement that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def fast_retry() -> RetryPolicy:
    return RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=4.0)


def whole_answer(vendor: str) -> dict[str, Any]:
    """A vendor's non-streamed answer "Hi." (11 prompt and 7 output tokens), as its API
    documents it: ``openai``, ``anthropic``, ``ollama`` or ``openai-responses``."""
    if vendor == "openai":
        message = {"role": "assistant", "content": "Hi."}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        return {"object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
    if vendor == "anthropic":
        return {
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [{"type": "text", "text": "Hi."}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 11, "output_tokens": 7},
        }
    if vendor == "openai-responses":
        text: dict[str, Any] = {"type": "output_text", "text": "Hi.", "annotations": []}
        item: dict[str, Any] = {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [text],
        }
        return {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": "m",
            "output": [item],
            "usage": {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18},
        }
    assert vendor == "ollama"
    return {
        "model": "m",
        "message": {"role": "assistant", "content": "Hi."},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 11,
        "eval_count": 7,
    }
