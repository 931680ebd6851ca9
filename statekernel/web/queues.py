"""The run queues' pages: the queues with their depth (``/queues``), a queue's entries
and dead letters (``/queues/{name}``), and two actions: put dead letters back on the
queue (``requeue``) and drop a run's entries (``drop``).

Looking asks the ``authorize`` hook for ``queues`` (no run id); an action asks it for
``requeue`` or ``drop`` with the run's id (None for every dead letter), after its CSRF
token is checked and before its form is read, as the runs' actions do. A view that
cannot act (read-only) refuses them.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from statekernel._front.reach import checked_queue_name
from statekernel.errors import InvalidArgument, StatekernelError
from statekernel.stores import ListsQueues, RunQueue
from statekernel.web.bodies import read_form
from statekernel.web.context import WebContext
from statekernel.web.links import path_for
from statekernel.web.notes import issued_note, note_query
from statekernel.web.pages import forbidden
from statekernel.web.rendering import renderer_of
from statekernel.web.security import sent_token

__all__ = ["QUEUE_ACTIONS", "queue_act", "queue_page", "queues_page"]

QUEUE_ACTIONS = ("requeue", "drop")
LIMIT = 200
"""Entries and dead letters a queue's page shows at most."""


def _web(request: Request) -> WebContext:
    web: WebContext = request.app.state.web
    return web


def _stamp(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _waited(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = max(int(time.time() * 1000) - ms, 0) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _refused(request: Request, status: int, message: str) -> Response:
    context = {"title": "Not done", "message": message}
    return renderer_of(request).page(request, "error.html", context, status=status)


def _queue(request: Request) -> RunQueue | Response:
    """The queue of the path, or the page saying why there is none."""
    store = _web(request).store
    if not isinstance(store, ListsQueues):
        return _refused(request, 404, "this store has no run queues (Redis and PostgreSQL do)")
    try:
        return store.run_queue(checked_queue_name(request.path_params["name"]))
    except InvalidArgument as exc:
        return _refused(request, 400, str(exc))


async def queues_page(request: Request) -> Response:
    """``/queues``: each queue with entries waiting, taken, dead letters, oldest wait."""
    if (refused := await forbidden(request, "queues", None)) is not None:
        return refused
    store = _web(request).store
    rows: list[dict[str, Any]] = []
    has_queues = isinstance(store, ListsQueues)
    if isinstance(store, ListsQueues):
        try:
            for name in await store.queue_names():
                depth = await store.run_queue(name).depth()
                rows.append({"depth": depth, "waited": _waited(depth.oldest_ms)})
        except StatekernelError as exc:
            return _refused(request, 503, f"the queues cannot be read: {exc}")
    context = {
        "rows": rows,
        "has_queues": has_queues,
        "note": issued_note(_web(request).csrf, request),
    }
    return renderer_of(request).page(request, "queues.html", context)


async def queue_page(request: Request) -> Response:
    """``/queues/{name}``: the queue's entries (oldest first) and dead letters."""
    if (refused := await forbidden(request, "queues", None)) is not None:
        return refused
    queue = _queue(request)
    if isinstance(queue, Response):
        return queue
    try:
        depth = await queue.depth()
        entries = await queue.entries(LIMIT)
        dead = await queue.dead_letters(LIMIT)
    except StatekernelError as exc:
        return _refused(request, 503, f"the queue cannot be read: {exc}")
    context = {
        "name": queue.name,
        "depth": depth,
        "waited": _waited(depth.oldest_ms),
        "entries": [{"e": e, "at": _stamp(e.submitted_ms)} for e in entries],
        "dead": [{"d": d, "at": _stamp(d.at_ms)} for d in dead],
        "note": issued_note(_web(request).csrf, request),
    }
    return renderer_of(request).page(request, "queue.html", context)


async def queue_act(request: Request) -> Response:
    """``POST /queues/{name}/{action}``: the action's name, its CSRF token and the
    ``authorize`` hook (on the run named in the query string, ``run_id``) are checked
    before its form is read."""
    name, action = request.path_params["name"], request.path_params["action"]
    web = _web(request)
    if action not in QUEUE_ACTIONS:
        return _refused(request, 404, f"no queue action {action!r}")
    if not web.csrf.check(request, sent_token(request)):
        return _refused(request, 403, "the CSRF token is missing or wrong: reload the page")
    run_id = request.query_params.get("run_id") or None
    if (denied := await forbidden(request, action, run_id)) is not None:
        return denied
    if web.actor is None:
        return _refused(request, 403, web.read_only_reason or "read-only")
    queue = _queue(request)
    if isinstance(queue, Response):
        return queue
    form = await read_form(request)
    try:
        said = await _do(queue, action, run_id, form.get("confirm") == "on")
    except InvalidArgument as exc:
        return _refused(request, 400, str(exc))
    except StatekernelError as exc:
        return _refused(request, 503, f"{type(exc).__name__}: {exc}")
    target = path_for(request, "queue", name=name)
    return RedirectResponse(f"{target}?{note_query(web.csrf, said)}", status_code=303)


async def _do(queue: RunQueue, action: str, run_id: str | None, confirmed: bool) -> str:
    if action == "requeue":
        count = await queue.revive(run_id)
        if run_id is not None and count == 0:
            raise InvalidArgument(f"queue {queue.name!r} has no dead letter of run {run_id!r}")
        return f"put {f'run {run_id}' if run_id else f'{count} run(s)'} back on the queue"
    if run_id is None:
        raise InvalidArgument("say which run's entries to drop")
    if not confirmed:
        raise InvalidArgument(f"tick 'sure' to drop the entries of run {run_id}")
    count = await queue.drop(run_id)
    if count == 0:
        raise InvalidArgument(
            f"queue {queue.name!r} holds no entry of run {run_id!r} that no worker has taken,"
            " and no dead letter of it"
        )
    return f"dropped {count} from the queue: run {run_id}"
