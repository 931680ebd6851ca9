"""The pages: the runs list and a run's page (at its head or at any revision), with the
fragments the live pages fetch again when the store says something changed."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from statekernel._lifecycle.diagram import can_render_svg
from statekernel._records.run import STATE_IDS, Run, StateId
from statekernel._secrets import redact
from statekernel.errors import ConfigError, CorruptCheckpoint, RunNotFound, StatekernelError
from statekernel.web.context import WebContext
from statekernel.web.forms import answer_fields
from statekernel.web.notes import issued_note
from statekernel.web.numbers import query_number
from statekernel.web.rendering import renderer_of
from statekernel.web.views import (
    RESOLVE_WARNING,
    ListRow,
    event_row,
    list_row,
    question_of,
    revision_diff,
    timeline,
    transcript,
    uncertain_ids,
)

__all__ = ["PAGE_SIZE", "SEARCH_LIMIT", "bad_request", "diagram_svg", "run_page", "runs_list"]

PAGE_SIZE = 50
SEARCH_LIMIT = 5000
"""Runs a search by id looks through (newest first) when no run has the id itself."""


def _web(request: Request) -> WebContext:
    web: WebContext = request.app.state.web
    return web


async def forbidden(request: Request, action: str, run_id: str | None) -> Response | None:
    """A 403 page when the ``authorize`` hook refuses the request, else None."""
    if await _web(request).authorized(request, action, run_id):
        return None
    said = f"not allowed: {action}" + (f" on run {run_id}" if run_id else "")
    return renderer_of(request).page(
        request, "error.html", {"title": "Forbidden", "message": said}, status=403
    )


async def bad_request(request: Request, exc: Exception) -> Response:
    """The 400 page of a request the view cannot read (a ``BadNumber`` naming its
    parameter)."""
    context = {"title": "Bad request", "message": str(exc)}
    return renderer_of(request).page(request, "error.html", context, status=400)


async def _search(web: WebContext, query: str, state: StateId | None) -> list[ListRow]:
    rows: list[ListRow] = []
    try:
        run = await web.store.load(query)
    except RunNotFound:
        pass
    except CorruptCheckpoint as exc:
        return [ListRow(query, "damaged", damaged=str(exc))]
    else:
        if state is None or run.state == state:
            from statekernel._storage.protocol import RunSummary

            return [list_row(RunSummary.of(run))]
    cursor: str | None = None
    looked = 0
    while looked < SEARCH_LIMIT:
        page = await web.store.list_runs(state=state, limit=500, cursor=cursor)
        looked += len(page.runs) + len(page.damaged)
        rows += [list_row(s) for s in page.runs if query in s.run_id]
        rows += [ListRow(d.run_id, "damaged", damaged=d.problem) for d in page.damaged
                 if query in d.run_id]  # fmt: skip
        cursor = page.next_cursor
        if cursor is None or len(rows) >= PAGE_SIZE:
            break
    return rows[:PAGE_SIZE]


async def runs_list(request: Request) -> Response:
    """``/``: runs, newest update first; ``state`` filters, ``q`` searches by id,
    ``cursor`` pages; ``fragment=1`` gives the table alone (live updates)."""
    if (refused := await forbidden(request, "view", None)) is not None:
        return refused
    web = _web(request)
    params = request.query_params
    state_arg = params.get("state") or None
    state: StateId | None = state_arg if state_arg in STATE_IDS else None
    query = (params.get("q") or "").strip()
    cursor = params.get("cursor") or None
    next_cursor: str | None = None
    if query:
        rows = await _search(web, query, state)
    else:
        try:
            page = await web.store.list_runs(state=state, limit=PAGE_SIZE, cursor=cursor)
        except StatekernelError as exc:  # a cursor from another store, a bad one
            return renderer_of(request).page(
                request, "error.html", {"title": "Cannot list", "message": str(exc)}, status=400
            )
        rows = [list_row(s) for s in page.runs]
        rows += [ListRow(d.run_id, "damaged", damaged=d.problem) for d in page.damaged]
        next_cursor = page.next_cursor
    context: dict[str, Any] = {
        "rows": rows,
        "states": STATE_IDS,
        "state": state or "",
        "q": query,
        "cursor": cursor or "",
        "next_cursor": next_cursor or "",
        "waiting": any(r.waiting_for for r in rows),
        "note": issued_note(web.csrf, request),
    }
    name = "list_table.html" if params.get("fragment") else "list.html"
    return renderer_of(request).page(request, name, context)


async def _load(web: WebContext, run_id: str, revision: int | None) -> Run:
    return await web.store.load(run_id, revision=revision)


async def run_page(request: Request) -> Response:
    """``/runs/{run_id}``: the run at its head, or at ``revision`` with what changed
    from the revision before; ``fragment=1`` gives the live part alone."""
    run_id = request.path_params["run_id"]
    if (refused := await forbidden(request, "view", run_id)) is not None:
        return refused
    web = _web(request)
    renderer = renderer_of(request)
    revision = query_number(request, "revision")
    try:
        head = await web.store.load(run_id)
        if revision is not None and revision > head.revision:
            message = f"run {run_id} has no revision {revision}"
            message += f" (its head is at revision {head.revision})"
            return renderer.page(
                request, "error.html", {"title": "No such revision", "message": message}, 404
            )
        run = head if revision is None else await _load(web, run_id, revision)
        before = await _load(web, run_id, revision - 1) if revision else None
        events = await web.store.events(run_id)
        nodes = await web.reader.tree(run_id)
    except RunNotFound as exc:
        return renderer.page(
            request, "error.html", {"title": "Not found", "message": str(exc)}, 404
        )
    except CorruptCheckpoint as exc:
        damaged = {"run_id": run_id, "problem": str(exc), "store_url": web.store_label}
        return renderer.page(request, "damaged.html", damaged, status=200)
    # the events of the revisions shown (a commit that landed since the head was read is
    # the stream's to send: the page follows from the head it shows)
    shown_events = [e for e in events if e.revision <= run.revision]
    question = question_of(run) if revision is None else None
    context: dict[str, Any] = {
        "run": run,
        "head": head,
        "at_revision": revision,
        "said": transcript(run),
        "events": [event_row(e) for e in shown_events],
        "last_revision": run.revision,
        "timeline": timeline(shown_events),
        "diff": revision_diff(before, run) if revision is not None else [],
        "children": nodes[1:],
        "question": question,
        "fields": answer_fields(question.asked.schema) if question is not None else [],
        "uncertain": sorted(uncertain_ids(run)) if revision is None else [],
        "pause_calls": _uncertain_calls(run) if revision is None else [],
        "driving": web.driving(run_id),
        "diagram": can_render_svg(),
        "resolve_warning": RESOLVE_WARNING,
        "note": issued_note(web.csrf, request),
        "error": "",
    }
    name = "run_live.html" if request.query_params.get("fragment") else "run.html"
    return renderer.page(request, name, context)


def _uncertain_calls(run: Run) -> list[dict[str, Any]]:
    from statekernel._records.pauses import Uncertain

    details = run.pause.details if run.pause is not None else None
    if not isinstance(details, Uncertain):
        return []
    return [
        {"id": c.id, "name": c.name, "input": c.input, "attempt": c.attempt}
        for c in details.unresolved
    ]


async def diagram_svg(request: Request) -> Response:
    """``/runs/{run_id}/diagram.svg``: the lifecycle with the run's path highlighted (as
    ``statekernel runs diagram`` draws it; needs Graphviz)."""
    run_id = request.path_params["run_id"]
    if (refused := await forbidden(request, "view", run_id)) is not None:
        return refused
    try:
        data = await _web(request).reader.diagram(run_id, format="svg")
    except RunNotFound as exc:
        return PlainTextResponse(redact(str(exc)), status_code=404)  # the id is the caller's text
    except (ConfigError, CorruptCheckpoint) as exc:
        return PlainTextResponse(redact(str(exc)), status_code=503)
    policy = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
    headers = {"Content-Security-Policy": policy}
    return Response(data, media_type="image/svg+xml", headers=headers)
