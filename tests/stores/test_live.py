"""The stores' transports of live events: a batch longer than a ``NOTIFY`` payload goes
in parts and comes back whole; a reader keeps what fits and counts what it drops;
nothing of it is stored."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, aclosing

import pytest

from statekernel import Event
from statekernel._storage.live import LiveFeed, encode, transport_of
from statekernel._storage.publishing import BUFFERED, Publisher
from statekernel.stores import MemoryStore, RedisStore, open_store


def delta(text: str, revision: int = 3) -> Event:
    return Event("text_delta", "r1", revision, data={"text": text})


async def test_a_long_batch_crosses_in_parts(feed_store_url: str) -> None:
    long = "é∑" + "x" * 30_000  # beyond NOTIFY's 8000 bytes, and not ASCII
    async with aclosing(open_store(feed_store_url)) as store:
        transport = transport_of(store)
        assert transport is not None
        feed = LiveFeed("r1")
        async with transport.subscribe("r1", feed.put_payload):
            payloads = encode("elsewhere", 1, "r1", [delta("a"), delta(long), delta("a")], 8000)
            assert len(payloads) > 3
            assert all(len(p.encode()) <= 8000 for p in payloads)
            await transport.send("r1", payloads)
            await transport.send("r1", encode("elsewhere", 2, "r1", [delta("a")], None))
            got = [await feed.next(60) for _ in range(4)]
        assert [e.data["text"] for e in got if e is not None] == ["a", long, "a", "a"]
        assert feed.dropped == 0
        assert not (await store.list_runs()).runs  # nothing of it was stored
        if isinstance(store, RedisStore):
            assert await store.client.keys("*live*") == []  # pub/sub keeps no key


async def test_a_reader_skips_what_its_own_store_object_sent_and_what_is_damaged() -> None:
    feed = LiveFeed("r1", ignore="me", capacity=2)
    feed.put_payload(encode("me", 1, "r1", [delta("mine")], None)[0])
    feed.put_payload(encode("other", 1, "r2", [delta("not this run")], None)[0])
    feed.put_payload('{"s": "other", "r": "r1", "e": [["run_completed", 1, {}, "x"]]}')
    feed.put_payload("~key 5 2 half")
    assert feed.take() is None
    assert feed.dropped == 3  # another run's, a stored event's type, a damaged part
    feed.put_payload(encode("other", 1, "r1", [delta("a"), delta("b"), delta("c")], None)[0])
    assert [e.data["text"] for e in (feed.take(), feed.take()) if e is not None] == ["a", "b"]
    assert feed.take() is None
    assert feed.dropped == 4  # "c" did not fit


async def test_a_publisher_never_waits_for_its_store_and_counts_what_it_drops() -> None:
    class Stuck:
        limit: int | None = None

        async def send(self, run_id: str, payloads: list[str]) -> None:
            await asyncio.Event().wait()  # a store that never answers

        def subscribe(
            self, run_id: str, put: Callable[[str], None]
        ) -> AbstractAsyncContextManager[None]:
            raise NotImplementedError

    publisher = Publisher(MemoryStore(), "r1", Stuck())
    for i in range(BUFFERED + 500):
        publisher.publish(delta(str(i)))
    assert publisher.dropped == 500  # at once: the buffer was full
    await publisher.close()  # within FLUSH_WITHIN: what it held is dropped
    assert publisher.dropped == BUFFERED + 500


async def test_a_commit_waiting_for_the_sender_is_cancelled_whenever_the_cancel_comes() -> None:
    """A drive cancelled while its commit waits for the live events to be sent stops with
    the cancellation, even when it comes in the loop turn the sending ends in (on Python
    3.11, ``asyncio.wait_for`` returned then, and the drive went on to the end of the run
    as if never cancelled). Each round cancels one loop turn later."""

    class Gated:
        limit: int | None = None

        def __init__(self) -> None:
            self.gate = asyncio.Event()

        async def send(self, run_id: str, payloads: list[str]) -> None:
            await self.gate.wait()

        def subscribe(
            self, run_id: str, put: Callable[[str], None]
        ) -> AbstractAsyncContextManager[None]:
            raise NotImplementedError

    cancelled_in_time = 0
    for turns in range(12):
        transport = Gated()
        publisher = Publisher(MemoryStore(), "r1", transport)
        publisher.publish(delta("a"))
        await asyncio.sleep(0)  # the sender holds it
        waiting = asyncio.create_task(publisher.settled())
        await asyncio.sleep(0)  # the commit waits for the sender
        transport.gate.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiting.cancel():
            cancelled_in_time += 1
            with pytest.raises(asyncio.CancelledError):
                await waiting
        else:
            assert waiting.done()
            assert waiting.exception() is None
        await publisher.close()
    assert 0 < cancelled_in_time < 12  # the rounds span the sending's end
