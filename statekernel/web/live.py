"""Live pages: one watch of the store (its own feed, or polling) for the whole view,
fanned out to every page that streams (Server-Sent Events).

However many pages stream, the view holds one subscription to the store's commits;
each page reads what changed from the store after a notice (notices are wake-ups, and
may be missed: a page also looks every ``LOOK_EVERY`` seconds without one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.watching import CommitNotice, watch
from statekernel.errors import StatekernelError

if TYPE_CHECKING:
    from statekernel.web.context import WebContext

__all__ = ["LOOK_EVERY", "Hub", "list_stream", "next_notice", "run_stream", "sse"]

LOOK_EVERY = 5.0
"""Seconds a streaming page waits for a notice before it reads the store all the same."""


def sse(event: str, data: str) -> str:
    """One Server-Sent Event (``data`` may hold newlines: each line is sent as one)."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {event}\n{lines}\n"


class Hub:
    """One watch of every run's commits, shared by the subscribers (started with the
    first, stopped after the last)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self._subscribers: set[asyncio.Queue[CommitNotice | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.watches = 0
        """How many watches of the store the hub has opened (one at a time)."""

    @property
    def subscribers(self) -> int:
        """Pages streaming now."""
        return len(self._subscribers)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[CommitNotice | None]]:
        """A queue of the notices of every commit from now on (None: the feed broke)."""
        queue: asyncio.Queue[CommitNotice | None] = asyncio.Queue(maxsize=1000)
        self._subscribers.add(queue)
        if self._task is None or self._task.done():
            ready = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._watching(ready))
            await ready.wait()
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)
            if not self._subscribers:
                await self._stop()

    async def _watching(self, ready: asyncio.Event) -> None:
        try:
            async with watch(self.store) as notices:
                self.watches += 1
                ready.set()
                async for notice in notices:
                    for queue in list(self._subscribers):
                        if queue.full():
                            queue.get_nowait()
                        queue.put_nowait(notice)
        except StatekernelError:  # the pages fall back to looking every LOOK_EVERY s
            for queue in list(self._subscribers):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)
        finally:
            ready.set()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def aclose(self) -> None:
        """Stop watching."""
        self._subscribers.clear()
        await self._stop()


async def next_notice(
    queue: asyncio.Queue[CommitNotice | None], run_id: str | None, wait: float = LOOK_EVERY
) -> None:
    """Wait for a notice about ``run_id`` (any run: None), or ``wait`` seconds."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    while (left := until - loop.time()) > 0:
        try:
            notice = await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            return
        if notice is None or run_id is None or notice.run_id == run_id:
            return


async def run_stream(request: Request) -> Response:
    """``/runs/{run_id}/stream?after=N``: the run's events after revision ``N`` as they
    are committed (``event: events``, rendered rows), then ``event: run`` with its
    revision and state after each change. With ``until=rest`` it ends (``event: rest``)
    once the run is paused, failed or completed and every event was sent."""
    from statekernel.web.rendering import renderer_of
    from statekernel.web.views import event_row

    run_id = request.path_params["run_id"]
    web: WebContext = request.app.state.web
    if not await web.authorized(request, "view", run_id):
        return Response("not allowed", status_code=403)
    text = request.query_params.get("after", "-1")
    after = int(text) if text.lstrip("-").isdigit() else -1
    until_rest = request.query_params.get("until") == "rest"
    renderer = renderer_of(request)

    async def stream() -> AsyncIterator[str]:
        nonlocal after
        async with web.hub.subscribe() as queue:
            yield sse("hello", "{}")
            while True:
                try:
                    run = await web.store.load(run_id)  # first: the events reach its revision
                    events = await web.store.events(run_id, after_revision=after)
                except StatekernelError as exc:
                    yield sse("gone", str(exc))
                    return
                if events:
                    rows = [event_row(e) for e in events]
                    html = renderer.fragment("event_rows.html", {"events": rows})
                    yield sse("events", html)
                    after = max(e.revision for e in events)
                    yield sse("run", json.dumps({"revision": run.revision, "state": run.state}))
                if until_rest and run.is_terminal:
                    yield sse("rest", json.dumps({"revision": run.revision, "state": run.state}))
                    return
                if await request.is_disconnected():
                    return
                await next_notice(queue, run_id)

    return StreamingResponse(stream(), media_type="text/event-stream", headers=NO_CACHE)


async def list_stream(request: Request) -> Response:
    """``/stream``: ``event: changed`` with the run id whenever a run is committed (the
    list page fetches its table again)."""
    web: WebContext = request.app.state.web
    if not await web.authorized(request, "view", None):
        return Response("not allowed", status_code=403)

    async def stream() -> AsyncIterator[str]:
        async with web.hub.subscribe() as queue:
            yield sse("hello", "{}")
            while not await request.is_disconnected():
                try:
                    notice = await asyncio.wait_for(queue.get(), LOOK_EVERY)
                except TimeoutError:
                    yield ": still here\n\n"
                    continue
                yield sse("changed", "" if notice is None else notice.run_id)

    return StreamingResponse(stream(), media_type="text/event-stream", headers=NO_CACHE)


NO_CACHE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
