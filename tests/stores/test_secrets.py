"""Secrets in the environment and in the store URL reach no stored byte, compressed or not.

A run executes through the kernel on each persistent store with ``OPENAI_API_KEY``
set to a recognisable key (the built-in ``openai`` provider, pointed at a local
server, really sends it) and, for Redis, a password in the store URL. Then every
stored byte is read back, and every compressed part unpacked, and searched.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis as redis_sync

import statekernel as sk
from statekernel.stores._format.blobs import blob_text
from statekernel.stores._format.dicts import ENTRY_DICT

from .conftest import REDIS_PASSWORD

KEY = "sk-test-RECOGNISABLE-6e1b0c55d2"
SECRETS = (KEY.encode(), REDIS_PASSWORD.encode())


@sk.tool
def lookup(city: str) -> str:
    """A long answer, so that it is stored compressed."""
    return json.dumps({"city": city, "hours": [{"h": h, "sky": "clear"} for h in range(40)]})


def _completion(message: dict[str, Any], finish: str) -> bytes:
    body = {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}  # fmt: skip
    return json.dumps(body).encode()


def _replies() -> Iterator[tuple[int, bytes]]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    yield 200, _completion({"role": "assistant", "tool_calls": [call]}, "tool_calls")
    yield 200, _completion({"role": "assistant", "content": "Clear all day."}, "stop")
    while True:  # a server that quotes the key back in its error
        error = {"message": f"Incorrect API key provided: {KEY}.", "code": "invalid_api_key"}
        yield 401, json.dumps({"error": error}).encode()


@pytest.fixture
async def model_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[bytes]]:
    """A local OpenAI-compatible server; yields the raw requests it received."""
    replies = _replies()
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        seen.append(head + await reader.readexactly(length))
        status, body = next(replies)
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    yield seen
    server.close()
    await server.wait_closed()


async def _drive(store_url: str) -> list[sk.Event]:
    events: list[sk.Event] = []
    async with sk.Kernel(store_url, tools=[lookup]) as kernel:
        ok = await kernel.start(model="openai/m", messages=["Weather in Paris?"])
        events += [e async for e in kernel.run(ok.run_id)]
        assert (await kernel.get(ok.run_id)).state == "completed"
        failing = await kernel.start(model="openai/m", messages=["And tomorrow?"])
        events += [e async for e in kernel.run(failing.run_id)]
        failed = await kernel.get(failing.run_id)
    assert failed.state == "failed"
    assert failed.failure is not None
    assert "Incorrect API key" in failed.failure.message
    return events


def _unpacked(data: bytes) -> list[bytes]:
    """``data`` and what any compressed or base64 part of it holds."""
    views = [data]
    if data[:2] == b"\x00z":
        views.append(blob_text(data).encode("utf-8", "surrogatepass"))
    if data[:2] == b"\x00\x01":
        views.append(zlib.decompressobj(-15, ENTRY_DICT).decompress(data[2:]))
    return views


def _file_views(data: bytes) -> list[bytes]:
    views = [data]
    for line in data.split(b"\n"):
        if line.startswith((b'["z",', b'["c",')):
            packed = json.loads(line[:-9])[2]
            if isinstance(packed, str):
                raw = base64.b64decode(packed)
                views += _unpacked((b"\x00z" if line[2:3] == b"z" else b"") + raw)
    return views


def _assert_clean(views: list[bytes], where: str) -> None:
    assert views
    for view in views:
        for secret in SECRETS:
            assert secret not in view, f"a secret in {where}"


async def test_no_secret_in_the_file_store(tmp_path: Path, model_server: list[bytes]) -> None:
    events = await _drive(f"file://{tmp_path}/runs")
    assert any(KEY.encode() in r for r in model_server), "the key was not used"
    _scan_files(tmp_path / "runs")
    _assert_clean([json.dumps(e.data, default=str).encode() for e in events], "events")


async def test_no_secret_in_the_sqlite_store(tmp_path: Path, model_server: list[bytes]) -> None:
    db = tmp_path / "runs.db"
    await _drive(f"sqlite:///{db}")
    assert any(KEY.encode() in r for r in model_server), "the key was not used"
    _scan_sqlite(db)


def _scan_files(folder: Path) -> None:
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert any(p.name == "log.jsonl" for p in files)
    for path in files:
        _assert_clean(_file_views(path.read_bytes()), str(path))


def _scan_sqlite(db: Path) -> None:
    for path in db.parent.glob(db.name + "*"):
        _assert_clean([path.read_bytes()], str(path))
    with sqlite3.connect(db) as conn:
        compressed = 0
        for table, column in (("runs", "head"), ("commits", "entry"), ("messages", "doc"),
                              ("turns", "doc"), ("blobs", "data")):  # fmt: skip
            for (value,) in conn.execute(f"SELECT {column} FROM {table}"):
                views = _unpacked(bytes(value))
                compressed += len(views) - 1
                _assert_clean(views, f"{table}.{column}")
    assert compressed, "nothing compressed was looked into"


@pytest.mark.redis
async def test_no_secret_in_the_redis_store(
    redis_password_url: str, model_server: list[bytes]
) -> None:
    prefix = "secrets"
    url = redis_password_url.replace("redis://", f"redis://:{REDIS_PASSWORD}@")
    await _drive(f"{url}?prefix={prefix}")
    assert any(KEY.encode() in r for r in model_server), "the key was not used"
    client = redis_sync.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    assert len(keys) > 5
    for key in keys:
        views: list[bytes] = [key, client.dump(key) or b""]
        kind = client.type(key)
        # the client answers bytes (no decode_responses); redis-py types bytes | str
        if kind == b"string":
            views.append(cast(bytes | None, client.get(key)) or b"")
        elif kind == b"list":
            items = cast(list[bytes], client.lrange(key, 0, -1))
            views += [v for item in items for v in _unpacked(item)]
        elif kind == b"hash":
            pairs = cast(dict[bytes, bytes], client.hgetall(key))
            views += [v for k, item in pairs.items() for v in (k, *_unpacked(item))]
        elif kind == b"zset":
            scored = cast(list[tuple[bytes, float]], client.zrange(key, 0, -1, withscores=True))
            views += [m for m, _ in scored]
        _assert_clean(views, key.decode())
    client.delete(*keys)
    client.close()
