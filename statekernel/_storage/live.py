"""Live events across processes: the events a drive yields but never stores
(``text_delta``, ``reasoning_delta``, ``tool_call_delta``, ``tool_output``, ``usage``),
carried from the process that drives a run to readers in any other process, on the
stores with a feed (Redis: pub/sub on a channel of the run; PostgreSQL: ``NOTIFY`` on a
channel of the run).

A store package registers the transport that carries them (``carries_live``). Nothing
is stored: what a reader is not listening for when it is sent is gone. Readers of the
store object the drive uses get the drive's live events in the process itself (every
store, also those without a feed), and skip the copies that come back on the feed.

Bounded everywhere: a reader keeps at most ``LiveFeed.capacity`` live events and drops
what does not fit (counted in ``dropped``); commit notices are not live events and never
go through here.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from statekernel._records.events import LIVE_EVENTS, Event

__all__ = [
    "LiveFeed",
    "Transport",
    "carries_live",
    "decode",
    "encode",
    "local_feeds",
    "source_of",
    "transport_of",
]

READER_CAPACITY = 10_000
"""Live events a reader keeps by default while it does not read them."""
PARTS_KEPT = 64
"""Payloads split in parts a reader assembles at once (older partial ones are dropped)."""


class Transport(Protocol):
    """How a store carries the live events of its runs between processes."""

    limit: int | None
    """The largest payload, in bytes, the store's feed carries (None: no limit)."""

    async def send(self, run_id: str, payloads: list[str]) -> None:
        """Send the payloads to the readers of ``run_id``'s live events.

        Raises:
            StatekernelError: the store failed.
        """
        ...

    def subscribe(
        self, run_id: str, put: Callable[[str], None]
    ) -> AbstractAsyncContextManager[None]:
        """Listen (once entered) for the payloads sent for ``run_id``, each given to
        ``put`` (called on the event loop, never blocking)."""
        ...


_factories: list[tuple[type, Callable[[Any], Transport | None]]] = []
_transports: weakref.WeakKeyDictionary[Any, Transport | None] = weakref.WeakKeyDictionary()
_tokens: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_local: weakref.WeakKeyDictionary[Any, dict[str, set[LiveFeed]]] = weakref.WeakKeyDictionary()


def carries_live(store_type: type, factory: Callable[[Any], Transport | None]) -> None:
    """Register ``factory``: the transport of the live events of a store of
    ``store_type`` (None: that store carries none, e.g. behind a pooler)."""
    _factories.append((store_type, factory))


def transport_of(store: object) -> Transport | None:
    """The transport of ``store``'s live events (one per store object), or None (also
    for a store object that takes no weak reference)."""
    try:
        return _transports[store]
    except KeyError:
        pass
    except TypeError:
        return None
    found: Transport | None = None
    for store_type, factory in _factories:
        if isinstance(store, store_type):
            found = factory(store)
            break
    _transports[store] = found
    return found


def source_of(store: object) -> str:
    """What the payloads this process sends through ``store`` say they come from."""
    try:
        token = _tokens.get(store)
        if token is None:
            token = _tokens[store] = uuid.uuid4().hex
    except TypeError:  # takes no weak reference: nothing of this process is skipped
        return ""
    return token


def local_feeds(store: object, run_id: str) -> set[LiveFeed]:
    """The feeds of this process reading ``run_id``'s live events through ``store``
    (none kept for a store object that takes no weak reference)."""
    try:
        runs = _local.get(store)
        if runs is None:
            runs = _local[store] = {}
    except TypeError:
        return set()
    return runs.setdefault(run_id, set())


def forget_local(store: object, run_id: str, feed: LiveFeed) -> None:
    """``feed`` no longer reads ``run_id``'s live events through ``store``."""
    try:
        runs = _local.get(store)
    except TypeError:
        return
    if runs is None:
        return
    feeds = runs.get(run_id)
    if feeds is not None:
        feeds.discard(feed)
        if not feeds:
            del runs[run_id]


def encode(
    source: str, number: int, run_id: str, events: list[Event], limit: int | None
) -> list[str]:
    """The payloads of a batch of live events: one JSON object, split in parts of at
    most ``limit`` bytes when longer (``~<key> <index> <count> <text>``)."""
    whole = json.dumps(
        {
            "s": source,
            "n": number,
            "r": run_id,
            "e": [[e.type, e.revision, e.data, e.at.isoformat()] for e in events],
        },
        ensure_ascii=True,  # bytes and characters are one: parts are cut by length
        separators=(",", ":"),
    )
    if limit is None or len(whole) <= limit:
        return [whole]
    key = f"{source}.{number}"
    room = limit - len(key) - 24  # the head: "~", the key and two numbers
    pieces = [whole[i : i + room] for i in range(0, len(whole), room)]
    return [f"~{key} {i} {len(pieces)} {piece}" for i, piece in enumerate(pieces)]


def decode(payload: str, run_id: str) -> tuple[str, list[Event]] | None:
    """The source and events of a whole payload about ``run_id`` (None: not one)."""
    try:
        found = json.loads(payload)
        if not isinstance(found, dict) or found.get("r") != run_id:
            return None
        source = found["s"]
        events = [
            Event(kind, run_id, revision, -1, data, datetime.fromisoformat(at))
            for kind, revision, data, at in found["e"]
        ]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(source, str):
        return None
    for event in events:
        ok = event.type in LIVE_EVENTS and type(event.revision) is int
        if not ok or not isinstance(event.data, dict):
            return None
    return source, events


class LiveFeed:
    """What a reader of a run has yet to take: live events (at most ``capacity``; what
    does not fit is dropped and counted in ``dropped``), and whether a commit notice
    came (``notify``)."""

    def __init__(self, run_id: str, *, ignore: str = "", capacity: int = READER_CAPACITY) -> None:
        self.run_id, self.capacity, self._ignore = run_id, capacity, ignore
        self.dropped = 0
        """Live events dropped: the reader was too slow, or a payload was damaged."""
        self._events: deque[Event] = deque()
        self._notified = False
        self._wake = asyncio.Event()
        self._parts: OrderedDict[str, list[str | None]] = OrderedDict()

    def put(self, event: Event) -> None:
        """Keep ``event`` for the reader, unless it holds ``capacity`` already."""
        if len(self._events) >= self.capacity:
            self.dropped += 1
            return
        self._events.append(event)
        self._wake.set()

    def notify(self) -> None:
        """A commit of the run was seen: the reader reads the store next."""
        self._notified = True
        self._wake.set()

    def put_payload(self, payload: str) -> None:
        """Keep the events of a payload from the feed (its parts assembled), unless
        this process sent it through the same store (the reader has them already)."""
        if payload.startswith("~"):
            whole = self._assemble(payload)
            if whole is None:
                return
            payload = whole
        decoded = decode(payload, self.run_id)
        if decoded is None:
            self.dropped += 1
            return
        source, events = decoded
        if not self._ignore or source != self._ignore:
            for event in events:
                self.put(event)

    def _assemble(self, part: str) -> str | None:
        try:
            key, index, count, text = part[1:].split(" ", 3)
            at, of = int(index), int(count)
        except ValueError:
            self.dropped += 1
            return None
        parts = self._parts.get(key)
        if parts is None or len(parts) != of or not 0 <= at < of:
            if not 0 <= at < of:
                self.dropped += 1
                return None
            parts = self._parts[key] = [None] * of
            while len(self._parts) > PARTS_KEPT:
                self._parts.popitem(last=False)
                self.dropped += 1
        parts[at] = text
        if any(p is None for p in parts):
            return None
        del self._parts[key]
        return "".join(p for p in parts if p is not None)

    def take(self) -> Event | None:
        """The next live event kept, without waiting (None: none is)."""
        return self._events.popleft() if self._events else None

    async def next(self, wait: float) -> Event | None:
        """The next live event; None once a commit notice came (or after ``wait``
        seconds without either): the reader then reads the store."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        while True:
            if self._events:
                return self._events.popleft()
            if self._notified:
                self._notified = False
                return None
            self._wake.clear()
            left = until - loop.time()
            if left <= 0:
                return None
            try:
                async with asyncio.timeout(left):
                    await self._wake.wait()
            except TimeoutError:
                return None
