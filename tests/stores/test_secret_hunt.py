"""A hunt for secrets: recognisable secrets go everywhere a secret can go, and then every
place statekernel writes to is searched for them.

Where they go: the API keys of the built-in ``openai``, ``anthropic`` and ``azure``
providers in the environment, each ending in a newline or a space (as keys read from
secret files do), sent for real to a loopback server speaking each vendor's wire format,
which quotes the key back in its 401; a Redis password in the store URL's query string;
an MCP HTTP server's URL with a user and password and a ``?token=``, and a bearer
header; an MCP stdio server's environment. What is searched: every stored byte of each
store (compressed parts unpacked), every event, every log record at DEBUG (httpx's and
httpcore's too), every span's status, attributes and events, and everything the command
line prints for ``runs list/show/events`` (with and without ``--json``), ``doctor`` and
``migrate``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis as redis_sync
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import statekernel as sk
from statekernel.errors import ConfigError
from statekernel.mcp import MCPConnection, mcp_http, mcp_stdio

from .conftest import PG_PASSWORD, REDIS_PASSWORD
from .test_secrets import _file_views, _unpacked

KEYS = {
    "openai": "sk-hunt-OPENAI-3b7e91",
    "anthropic": "sk-ant-hunt-ANTHROPIC-c0ffee",
    "azure": "hunt-AZURE-5150aa",
}
MCP_PASSWORD = "mcp-PASS-u53r9"
MCP_TOKEN = "mcp-QUERY-t0ken"
MCP_BEARER = "mcp-HEADER-b34r3r"
MCP_ENV = "mcp-ENV-s3cr3t"
SECRETS = (
    *KEYS.values(),
    REDIS_PASSWORD,
    PG_PASSWORD,
    MCP_PASSWORD,
    MCP_TOKEN,
    MCP_BEARER,
    MCP_ENV,
)
MODELS = {"openai": "openai/m", "anthropic": "anthropic/m", "azure": "azure/dep"}
MCP_SERVER = Path(__file__).resolve().parents[1] / "statekernel" / "kernel" / "mcp_server.py"


def _clean(text: str | bytes, where: str) -> None:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    for secret in SECRETS:
        assert secret.encode() not in data, f"{secret!r} in {where}"


# -- a loopback server speaking the three vendors' wire formats --------------------------


def _openai_reply(body: dict[str, Any]) -> dict[str, Any]:
    answered = any(m.get("role") == "tool" for m in body["messages"])
    calls = [
        {"id": "call_1", "type": "function",
         "function": {"name": "echo", "arguments": '{"text": "hi"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "fail", "arguments": '{"reason": "r"}'}},
    ]  # fmt: skip
    message = (
        {"role": "assistant", "content": "done"}
        if answered
        else {"role": "assistant", "content": None, "tool_calls": calls}
    )
    return {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "stop" if answered else "tool_calls"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}  # fmt: skip


def _anthropic_reply(body: dict[str, Any]) -> dict[str, Any]:
    answered = any(
        isinstance(m.get("content"), list)
        and any(b.get("type") == "tool_result" for b in m["content"])
        for m in body["messages"]
    )
    content: list[dict[str, Any]] = (
        [{"type": "text", "text": "done"}]
        if answered
        else [
            {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "hi"}},
            {"type": "tool_use", "id": "toolu_2", "name": "fail", "input": {"reason": "r"}},
        ]
    )
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": content, "stop_reason": "end_turn" if answered else "tool_use",
            "usage": {"input_tokens": 3, "output_tokens": 2}}  # fmt: skip


class VendorServer:
    """Answers chat completions (OpenAI, Azure) and messages (Anthropic) as JSON; a
    conversation that says "fail" gets a 401 quoting the credential it was sent."""

    def __init__(self) -> None:
        self.credentials: list[str] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {
            k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
        }
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
        credential = (
            headers.get("authorization") or headers.get("x-api-key") or headers.get("api-key", "")
        )
        self.credentials.append(credential)
        said = json.dumps(body["messages"][0])
        status, reply = 200, {}
        if "fail" in said and "tool" not in json.dumps(body["messages"][1:]):
            status = 401
            message = f"Incorrect API key provided: {credential!r} ({credential})"
            if path.endswith("/messages"):
                reply = {"type": "error",
                         "error": {"type": "authentication_error", "message": message}}  # fmt: skip
            else:
                reply = {"error": {"message": message, "code": "invalid_api_key"}}
        elif path.endswith("/messages"):
            reply = _anthropic_reply(body)
        else:
            reply = _openai_reply(body)
        data = json.dumps(reply).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(data), data)
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def vendors(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[VendorServer]:
    """The vendor server, with each provider's key (ending in whitespace) in the
    environment and each provider pointed at the server."""
    server = VendorServer()
    await server.start()
    monkeypatch.setenv("OPENAI_API_KEY", KEYS["openai"] + "\n")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEYS["anthropic"] + " \n")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", KEYS["azure"] + "\r\n")
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.url)
    yield server
    await server.stop()


# -- MCP servers ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def mcp_url(mcp_http_url: str) -> str:
    """The tests' MCP HTTP server, reached with a user, a password and a ``?token=``."""
    return mcp_http_url.replace("http://", f"http://svc:{MCP_PASSWORD}@") + f"?token={MCP_TOKEN}"


async def _mcp_tools(url: str, folder: Path) -> tuple[list[sk.Tool], MCPConnection]:
    """``echo`` from a stdio server (a secret in its environment) and ``fail`` from an
    HTTP server whose connection is closed before the run: calling it is an error result
    that names the connection."""
    env = {"MCP_TEST_LOG": str(folder / "mcp.log"), "HUNT_API_TOKEN": MCP_ENV}
    stdio = mcp_stdio(sys.executable, [str(MCP_SERVER)], env=env)
    await stdio.start()
    echo = next(t for t in await stdio.tools() if t.name == "echo")
    async with mcp_http(url, headers={"Authorization": f"Bearer {MCP_BEARER}"}) as http:
        fail = next(t for t in await http.tools() if t.name == "fail")
    return [echo, fail], stdio


# -- the hunt -------------------------------------------------------------------------------


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "statekernel", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "NO_COLOR": "1", "PYTHONSAFEPATH": "1"},
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout + done.stderr


def _stored_views(store: str, url: str, folder: Path) -> list[tuple[str, bytes]]:
    if store == "file":
        files = [p for p in (folder / "runs").rglob("*") if p.is_file()]
        return [(str(p), v) for p in files for v in _file_views(p.read_bytes())]
    if store == "sqlite":
        db = folder / "runs.db"
        views = [(str(p), p.read_bytes()) for p in folder.glob("runs.db*")]
        with sqlite3.connect(db) as conn:
            for table, column in (("runs", "head"), ("commits", "entry"), ("messages", "doc"),
                                  ("turns", "doc"), ("blobs", "data")):  # fmt: skip
                for (value,) in conn.execute(f"SELECT {column} FROM {table}"):
                    views += [(f"{table}.{column}", v) for v in _unpacked(bytes(value))]
        return views
    if store == "postgres":
        return _postgres_views(url)
    client = redis_sync.Redis.from_url(url.split("?")[0], password=REDIS_PASSWORD)
    views = []
    for key in client.scan_iter(match="hunt*"):
        views.append((key.decode(), client.dump(key) or b""))
        if client.type(key) == b"list":
            for item in cast(list[bytes], client.lrange(key, 0, -1)):
                views += [(key.decode(), v) for v in _unpacked(item)]
        elif client.type(key) == b"hash":
            for item in cast(dict[bytes, bytes], client.hgetall(key)).values():
                views += [(key.decode(), v) for v in _unpacked(item)]
    client.close()
    return views


def _postgres_views(url: str) -> list[tuple[str, bytes]]:
    """Every value of every table of the store's schema, as stored and unpacked."""
    import asyncpg

    from statekernel.stores.postgres._url import parse_postgres_url

    target = parse_postgres_url(url)

    async def read() -> list[tuple[str, bytes]]:
        conn = await asyncpg.connect(target.dsn)
        views: list[tuple[str, bytes]] = []
        try:
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                target.schema,
            )
            for (table,) in tables:
                for row in await conn.fetch(f'SELECT * FROM "{target.schema}"."{table}"'):
                    for value in row.values():
                        raw = value if isinstance(value, bytes) else str(value).encode()
                        views += [(f"{table}", v) for v in _unpacked(raw)]
        finally:
            await conn.close()
        return views

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # this thread runs a loop
        return pool.submit(asyncio.run, read()).result()


async def _hunt_runs(url: str, tools: list[sk.Tool]) -> tuple[list[str], list[sk.Event]]:
    events: list[sk.Event] = []
    run_ids = []
    async with sk.Kernel(url, tools=tools) as kernel:
        for provider, model in MODELS.items():
            ok = await kernel.start(model=model, messages=["go"])
            events += [e async for e in kernel.run(ok.run_id)]
            done = await kernel.get(ok.run_id)
            assert done.state == "completed", (provider, done.failure)
            errors = [r.error for r in done.turns[0].completed if r.error]
            assert len(errors) == 1
            assert "MCP server 'http://svc:***@127.0.0.1:" in errors[0]
            assert "token=***" in errors[0]
            failing = await kernel.start(model=model, messages=["fail"])
            events += [e async for e in kernel.run(failing.run_id)]
            failed = await kernel.get(failing.run_id)
            assert failed.failure is not None
            assert failed.failure.error == "AuthenticationFailed", failed.failure
            run_ids += [ok.run_id, failing.run_id]
    return run_ids, events


@pytest.mark.parametrize(
    "store",
    [
        pytest.param("sqlite", marks=pytest.mark.redis),
        pytest.param("file", marks=pytest.mark.redis),
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
async def test_no_secret_comes_out_anywhere(
    store: str,
    tmp_path: Path,
    vendors: VendorServer,
    mcp_url: str,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    if store == "postgres":
        url = request.getfixturevalue("postgres_password_url")
    elif store == "redis":
        base = request.getfixturevalue("redis_password_url")
        url = f"{base}/0?password={REDIS_PASSWORD}&prefix=hunt{tmp_path.name[-6:]}"
    else:
        url = f"sqlite:///{tmp_path}/runs.db" if store == "sqlite" else f"file://{tmp_path}/runs"
    caplog.set_level(logging.DEBUG)
    tools, stdio = await _mcp_tools(mcp_url, tmp_path)
    try:
        run_ids, events = await _hunt_runs(url, tools)
    finally:
        await stdio.aclose()
    refused = mcp_http(mcp_url.replace(mcp_url.split(":")[2].split("/")[0], str(_free_port())))
    with pytest.raises(ConfigError) as caught:
        async with refused:
            pass
    _clean(str(caught.value), "the ConfigError of a refused MCP connection")
    _clean(repr(refused.name), "the name of an MCP connection")

    sent = {k: any(v in c for c in vendors.credentials) for k, v in KEYS.items()}
    assert all(sent.values()), f"not every key reached its vendor: {sent}"
    for where, view in _stored_views(store, url, tmp_path):
        _clean(view, where)
    for event in events:
        _clean(json.dumps(event.data, default=str), f"event {event.type}")
    assert any(r.levelno == logging.DEBUG for r in caplog.records)
    for record in caplog.records:
        _clean(record.getMessage(), f"log record of {record.name}")
    _clean(caplog.text, "the formatted log")
    finished = spans.get_finished_spans()
    assert any(s.status.description for s in finished), "no span ended in error"
    for span in finished:
        _clean(json.dumps(dict(span.attributes or {}), default=str), f"span {span.name}")
        _clean(span.status.description or "", f"status of span {span.name}")
        for noted in span.events:
            attributes = json.dumps(dict(noted.attributes or {}), default=str)
            _clean(attributes, f"span event {noted.name}")

    outputs = [_cli("runs", "list", "--store", url), _cli("runs", "list", "--store", url, "--json")]
    for run_id in run_ids[:2]:
        for command in ("show", "events"):
            outputs += [
                _cli("runs", command, run_id, "--store", url),
                _cli("runs", command, run_id, "--store", url, "--json"),
            ]
    outputs.append(_cli("doctor", "--store", url))
    outputs.append(_cli("migrate", url, f"sqlite:///{tmp_path}/copy.db"))
    outputs.append(_cli("migrate", f"sqlite:///{tmp_path}/copy.db", url, "--json"))
    assert "AuthenticationFailed" in "".join(outputs)
    for output in outputs:
        _clean(output, f"command line output: {output[:300]}")
