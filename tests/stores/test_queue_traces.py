"""The trace context a queue entry carries (Redis, Redis Cluster, PostgreSQL): the one of
the span current at ``Kernel.submit``, kept by delayed and keyed entries (moved to the
stream by the Redis scripts), by an entry handed back, and by a dead letter put back;
entries written without one (by the release before) read as entries without one. A
worker driving under it: ``tests/statekernel/workers/test_worker_submit_trace.py``."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import statekernel as sk
from statekernel._storage.queues import ListsQueues, QueueEntry, RunQueue
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.stores.redis._queue import RedisRunQueue
from statekernel.telemetry import TraceParent

TRACE = TraceParent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "vendor=v1")
OTHER = TraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


@pytest.fixture
def kernel(queue_kernel: sk.Kernel) -> sk.Kernel:
    """A kernel on each store with run queues."""
    return queue_kernel


async def _queue(kernel: sk.Kernel, name: str = "default") -> RunQueue:
    assert isinstance(kernel.store, ListsQueues)
    queue = kernel.store.run_queue(name)
    await queue.prepare()
    return queue


async def _start(kernel: sk.Kernel, *run_ids: str) -> None:
    for run_id in run_ids:
        await kernel.start(model="scripted/m", messages=["go"], run_id=run_id)


async def _read(queue: RunQueue, n: int) -> dict[str, QueueEntry]:
    """The next ``n`` entries, by run id, read as they become due (a delayed entry's time
    passes on the server's clock)."""
    found: dict[str, QueueEntry] = {}
    async with asyncio.timeout(60):
        while len(found) < n:
            found |= {e.run_id: e for e in await queue.read("w", n, 50)}
    return found


async def test_submit_records_the_current_span_in_the_entry(kernel: sk.Kernel) -> None:
    await _start(kernel, "traced", "delayed", "keyed", "bare")
    span = NonRecordingSpan(
        SpanContext(
            0x0AF7651916CD43DD8448EB211C80319C,
            0xB7AD6B7169203331,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
            trace_state=TraceState([("vendor", "v1")]),
        )
    )
    with trace.use_span(span):
        await kernel.submit("traced")
        await kernel.submit("delayed", delay=0.001)
        await kernel.submit("keyed", key="k")
    await kernel.submit("bare")  # no span current: no trace context
    taken = await _read(await _queue(kernel), 4)
    assert {run_id: e.trace for run_id, e in taken.items()} == {
        "traced": TRACE,
        "delayed": TRACE,
        "keyed": TRACE,
        "bare": None,
    }


async def test_delayed_and_keyed_entries_keep_their_trace_context(kernel: sk.Kernel) -> None:
    queue = await _queue(kernel)
    await queue.submit("plain", trace=TRACE)
    await queue.submit("delayed", delay_ms=1, trace=TRACE)
    await queue.submit("keyed", key="k", key_limit=2, trace=OTHER)
    await queue.submit("both", delay_ms=1, key="k", key_limit=2, trace=TRACE)
    await queue.submit("none", delay_ms=1, key="j")
    listed = await queue.entries()  # an operator lists the entries kept aside with them
    assert sorted(e.run_id for e in listed) == ["both", "delayed", "keyed", "none", "plain"]
    taken = await _read(queue, 5)
    assert {run_id: e.trace for run_id, e in taken.items()} == {
        "plain": TRACE,
        "delayed": TRACE,
        "keyed": OTHER,
        "both": TRACE,
        "none": None,
    }
    assert taken["both"].key == "k"


async def test_an_entry_handed_back_or_put_back_from_the_dead_keeps_it(
    kernel: sk.Kernel,
) -> None:
    queue = await _queue(kernel)
    await queue.submit("plain", trace=TRACE)
    await queue.submit("keyed", key="k", trace=OTHER)
    await queue.submit("bare")
    first = await _read(queue, 3)
    for entry in first.values():
        await queue.requeue(entry)
    again = await _read(queue, 3)
    assert {r: e.trace for r, e in again.items()} == {"plain": TRACE, "keyed": OTHER, "bare": None}
    assert again["keyed"].key == "k"
    for entry in again.values():
        await queue.dead(entry, "failed", "it failed", "w")
    assert await queue.revive() == 3  # ``statekernel queues requeue``
    revived = await _read(queue, 3)
    assert {r: e.trace for r, e in revived.items()} == {
        "plain": TRACE,
        "keyed": OTHER,
        "bare": None,
    }


@pytest.mark.redis
async def test_redis_entries_written_without_a_trace_context_still_read(
    redis_store_url: str,
) -> None:
    """As the release before wrote them: stream entries without ``tp``, delayed and keyed
    members of five elements (moved to the stream by the scripts); a ``tp`` that is not
    UTF-8 is read as text with replacement characters, not as an error."""
    async with sk.Kernel(redis_store_url, providers={}) as kernel:
        queue = await _queue(kernel)
        assert isinstance(queue, RedisRunQueue)
        client = queue.client
        await client.xadd(queue.key, {"run": "old", "at": 1})
        await client.xadd(queue.key, {"run": "damaged", "at": 2, "tp": b"\xff\xfe-1", "ts": "x"})
        delayed = json.dumps(["old-delayed", 3, "waiting-1", None, 1])
        await client.zadd(queue.delayed_key, {delayed: 0})  # due at once
        keyed = json.dumps(["old-keyed", 4, "waiting-2", "k", 1])
        await client.rpush(f"{queue.key}:kq:k", keyed)
        await client.zadd(f"{queue.key}:keys", {"k": 0})
        assert {e.run_id for e in await queue.entries()} == {
            "old",
            "damaged",
            "old-delayed",
            "old-keyed",
        }
        taken = await _read(queue, 4)
        assert {r: e.trace for r, e in taken.items() if r != "damaged"} == {
            "old": None,
            "old-delayed": None,
            "old-keyed": None,
        }
        assert taken["old-keyed"].key == "k"
        assert taken["damaged"].trace == TraceParent("\ufffd\ufffd-1", "x")


@pytest.mark.postgres
async def test_postgres_entries_written_without_a_trace_context_still_read(
    postgres_store_url: str,
) -> None:
    async with sk.Kernel(postgres_store_url, providers={}) as kernel:
        queue = await _queue(kernel)
        target = parse_postgres_url(postgres_store_url)
        conn = await asyncpg.connect(target.dsn)
        try:  # as the release before wrote them: no trace columns named
            await conn.execute(
                f'INSERT INTO "{target.schema}".queue_entries (queue, run_id, submitted_ms)'
                " VALUES ('default', 'old'::bytea, 1)"
            )
        finally:
            await conn.close()
        taken = await _read(queue, 1)
        assert taken["old"].trace is None
