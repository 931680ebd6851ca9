"""The live streams (Server-Sent Events) of the pages: a run's events as they are
committed, and the list's notices of commits; both fed by the view's one watch."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from statekernel import Event
from statekernel.errors import StatekernelError
from statekernel.stores import CommitNotice, LiveFeed, live_feed
from statekernel.web.context import WebContext
from statekernel.web.live import LOOK_EVERY, next_notice, sse
from statekernel.web.numbers import BadNumber, query_number, whole_number
from statekernel.web.rendering import renderer_of
from statekernel.web.tenants import visible_ids
from statekernel.web.views import event_row

__all__ = ["list_stream", "run_stream"]


async def run_stream(request: Request) -> Response:
    """``/runs/{run_id}/stream?after=N``: the run's events after revision ``N`` (from
    the first without it; not a whole number: 400) as they are committed (``event:
    events``, rendered rows), then ``event: run`` with its revision and state after
    each change. With ``until=rest`` it ends (``event: rest``)
    once the run is paused, failed or completed and every event was sent."""
    run_id = request.path_params["run_id"]
    web: WebContext = request.app.state.web
    if not await web.authorized(request, "view", run_id):
        return Response("not allowed", status_code=403)
    asked = query_number(request, "after")
    # a browser that lost the stream reconnects with the query it began with and the id
    # of the last events it took: it goes on after those, not from the start again
    after = max(-1 if asked is None else asked, _last_event_id(request))
    until_rest = request.query_params.get("until") == "rest"
    renderer = renderer_of(request)

    async def stream() -> AsyncIterator[str]:
        nonlocal after
        async with web.hub.subscribe() as queue, _live(web, run_id, queue) as feed:
            yield sse("hello", "{}")
            while True:
                try:
                    run = await web.store.load(run_id)  # first: the events reach its revision
                    events = await web.store.events(run_id, after_revision=after)
                except StatekernelError as exc:
                    yield sse("gone", str(exc))
                    return
                while feed is not None and (live := feed.take()) is not None:
                    yield _live_event(live)  # sent before those commits
                if events:
                    rows = [event_row(e) for e in events]
                    html = renderer.fragment("event_rows.html", {"events": rows})
                    after = max(e.revision for e in events)
                    yield sse("events", html, event_id=str(after))
                    yield sse("run", json.dumps({"revision": run.revision, "state": run.state}))
                if until_rest and run.is_terminal:
                    yield sse("rest", json.dumps({"revision": run.revision, "state": run.state}))
                    return
                if await request.is_disconnected():
                    return
                if feed is None:
                    await next_notice(queue, run_id)
                    continue
                while (live := await feed.next(LOOK_EVERY)) is not None:
                    yield _live_event(live)

    return StreamingResponse(stream(), media_type="text/event-stream", headers=NO_CACHE)


@contextlib.asynccontextmanager
async def _live(
    web: WebContext, run_id: str, queue: asyncio.Queue[CommitNotice | None]
) -> AsyncIterator[LiveFeed | None]:
    """The run's live events (from the process that drives it, on a store with a feed,
    or from a drive of this view), woken by the hub's notices about the run; None when
    the store failed to subscribe (the page then follows the commits alone)."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            feed = await stack.enter_async_context(live_feed(web.store, run_id, notices=False))
        except StatekernelError:
            yield None
            return
        pump = asyncio.create_task(_pump(queue, run_id, feed))
        try:
            yield feed
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump


async def _pump(queue: asyncio.Queue[CommitNotice | None], run_id: str, feed: LiveFeed) -> None:
    while True:
        await next_notice(queue, run_id)
        feed.notify()


def _live_event(event: Event) -> str:
    """``event: live``: a live event (a text delta ...) as JSON, shown as it comes."""
    body = {"type": event.type, "revision": event.revision, "data": event.data}
    return sse("live", json.dumps(body))


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
                    async with asyncio.timeout(LOOK_EVERY):
                        notice = await queue.get()
                except TimeoutError:
                    yield ": still here\n\n"
                    continue
                if notice is None:  # the feed lost track: every list looks again
                    yield sse("changed", "")
                elif await visible_ids(web, request, [notice.run_id]):
                    yield sse("changed", notice.run_id)

    return StreamingResponse(stream(), media_type="text/event-stream", headers=NO_CACHE)


def _last_event_id(request: Request) -> int:
    """The revision of the ``Last-Event-ID`` header a browser sends back as it was
    given; -1 (before the first) for none, or one that is not a whole number (as
    ``whole_number`` reads them)."""
    try:
        return whole_number(request.headers.get("last-event-id") or "-", "Last-Event-ID")
    except BadNumber:
        return -1


NO_CACHE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
