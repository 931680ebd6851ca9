"""The pages: the runs list and a run's page (at its head or at any revision), with the
fragments the live pages fetch again when the store says something changed."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from statekernel import STATE_IDS, Run, StateId
from statekernel._front.limits import limits_text
from statekernel._front.reach import can_render_svg, parse_tag, redact
from statekernel.errors import (
    ConfigError,
    CorruptCheckpoint,
    InvalidTag,
    RunNotFound,
    StatekernelError,
)
from statekernel.web.alive import run_owner, with_owners
from statekernel.web.context import WebContext
from statekernel.web.diffs import revision_change
from statekernel.web.forms import answer_fields
from statekernel.web.links import path_for
from statekernel.web.notes import issued_note
from statekernel.web.numbers import query_number
from statekernel.web.paging import (
    TURNS_SHOWN,
    events_window,
    messages_window,
    page_link,
    transcript_page,
)
from statekernel.web.rendering import renderer_of
from statekernel.web.tenants import shown_rows, visible, visible_ids
from statekernel.web.views import (
    RESOLVE_WARNING,
    ListRow,
    event_row,
    limit_form,
    question_of,
    timeline,
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


def _tags(params: Any) -> dict[str, str]:
    """The tags a list is filtered by: each ``tag=KEY=VALUE`` parameter, and the pairs
    of ``tags`` (the search box: ``KEY=VALUE`` pairs between spaces); ``InvalidTag`` for
    one against the rules (a 400 page), or a key given twice with two values."""
    tags: dict[str, str] = {}
    for text in [*params.getlist("tag"), *(params.get("tags") or "").split()]:
        key, value = parse_tag(text)
        if tags.get(key, value) != value:
            raise InvalidTag(f"tag {key!r} is given twice, {tags[key]!r} and {value!r}", key=key)
        tags[key] = value
    return tags


async def _search(
    web: WebContext, request: Request, query: str, state: StateId | None, tags: dict[str, str]
) -> list[ListRow]:
    rows: list[ListRow] = []
    if await visible_ids(web, request, [query]):
        try:
            run = await web.store.load(query)
        except RunNotFound:
            pass
        except CorruptCheckpoint as exc:
            return [ListRow(query, "damaged", damaged=str(exc))]
        else:
            if (state is None or run.state == state) and run.tags.items() >= tags.items():
                from statekernel.stores import RunSummary

                return await shown_rows(web, request, [RunSummary.of(run)])
    cursor: str | None = None
    looked = 0
    while looked < SEARCH_LIMIT:
        page = await web.store.list_runs(state=state, limit=500, cursor=cursor, tags=tags or None)
        looked += len(page.runs) + len(page.damaged)
        rows += await shown_rows(web, request, [s for s in page.runs if query in s.run_id])
        damaged = [ListRow(d.run_id, "damaged", damaged=d.problem) for d in page.damaged
                   if query in d.run_id]  # fmt: skip
        rows += await visible(web, request, damaged)
        cursor = page.next_cursor
        if cursor is None or len(rows) >= PAGE_SIZE:
            break
    return rows[:PAGE_SIZE]


async def _page(
    web: WebContext,
    request: Request,
    state: StateId | None,
    cursor: str | None,
    tags: dict[str, str],
) -> tuple[list[ListRow], str | None]:
    """A page of the list: the rows of the store's pages from ``cursor`` on that the
    request may view, at least ``PAGE_SIZE`` of them while there are more (a hook that
    refuses most runs makes the view read further, up to ``SEARCH_LIMIT`` runs)."""
    rows: list[ListRow] = []
    looked = 0
    while True:
        page = await web.store.list_runs(
            state=state, limit=PAGE_SIZE, cursor=cursor, tags=tags or None
        )
        looked += len(page.runs) + len(page.damaged)
        rows += await shown_rows(web, request, page.runs)
        damaged = [ListRow(d.run_id, "damaged", damaged=d.problem) for d in page.damaged]
        rows += await visible(web, request, damaged)
        cursor = page.next_cursor
        if cursor is None or len(rows) >= PAGE_SIZE or looked >= SEARCH_LIMIT:
            return rows, cursor


async def runs_list(request: Request) -> Response:
    """``/``: runs, newest update first; ``state`` and ``tag`` (``KEY=VALUE``, repeated;
    or ``tags``, pairs between spaces) filter, ``q`` searches by id, ``cursor`` pages;
    ``fragment=1`` gives the table alone (live updates)."""
    if (refused := await forbidden(request, "view", None)) is not None:
        return refused
    web = _web(request)
    params = request.query_params
    state_arg = params.get("state") or None
    state: StateId | None = state_arg if state_arg in STATE_IDS else None
    query = (params.get("q") or "").strip()
    cursor = params.get("cursor") or None
    next_cursor: str | None = None
    try:
        tags = _tags(params)
    except InvalidTag as exc:
        return await bad_request(request, exc)
    if query:
        rows = await _search(web, request, query, state, tags)
    else:
        try:
            rows, next_cursor = await _page(web, request, state, cursor, tags)
        except StatekernelError as exc:  # a cursor from another store, a bad one
            return renderer_of(request).page(
                request, "error.html", {"title": "Cannot list", "message": str(exc)}, status=400
            )
    rows = await with_owners(web.store, rows)
    context: dict[str, Any] = {
        "rows": rows,
        "states": STATE_IDS,
        "state": state or "",
        "q": query,
        "tags": " ".join(f"{k}={v}" for k, v in tags.items()),
        "tagged": any(r.tags for r in rows),
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
    from the revision before; ``fragment=1`` gives the live part alone. The transcript
    and the events show their latest page, or the one before ``transcript_before`` (a
    message's position) and ``events_before`` (an event's number); see ``paging``."""
    run_id = request.path_params["run_id"]
    if (refused := await forbidden(request, "view", run_id)) is not None:
        return refused
    web = _web(request)
    renderer = renderer_of(request)
    revision = query_number(request, "revision")
    transcript_before = query_number(request, "transcript_before")
    events_before = query_number(request, "events_before")
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
        # in a worker thread, long on a long run (nothing else reads the two runs meanwhile)
        diff = await revision_change(before, run) if revision is not None else []
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
    base = path_for(request, "run", run_id=run_id)
    kept = {"transcript_before": transcript_before, "events_before": events_before}
    query = {"revision": revision, **kept}
    said_page = messages_window(len(run.messages), transcript_before, query, base)
    events_page = events_window(shown_events, events_before, query, base)
    context: dict[str, Any] = {
        "run": run,
        "head": head,
        "at_revision": revision,
        "said": transcript_page(run, said_page),
        "said_page": said_page,
        "events": [event_row(e) for e in shown_events[events_page.start : events_page.stop]],
        "events_page": events_page,
        "live_fragment": page_link(base, {"fragment": 1, **kept}),
        "last_revision": run.revision,
        "timeline": timeline(shown_events)[-TURNS_SHOWN:],
        "diff": diff,
        "children": await _visible_tree(web, request, nodes[1:]),
        "parent_shown": bool(
            run.parent_run_id and await visible_ids(web, request, [run.parent_run_id])
        ),
        "question": question,
        "limit": limit_form(run),
        "limits": limits_text(run.limits) if run.limits is not None else "",
        "fields": answer_fields(question.asked.schema) if question is not None else [],
        "uncertain": sorted(uncertain_ids(run)) if revision is None else [],
        "pause_calls": _uncertain_calls(run) if revision is None else [],
        "driving": web.driving(run_id),
        "owner": await run_owner(web.store, head),
        "diagram": can_render_svg(),
        "resolve_warning": RESOLVE_WARNING,
        "note": issued_note(web.csrf, request),
        "error": "",
    }
    name = "run_live.html" if request.query_params.get("fragment") else "run.html"
    return renderer.page(request, name, context)


async def _visible_tree(
    web: WebContext, request: Request, nodes: list[tuple[int, Run]]
) -> list[tuple[int, Run]]:
    """The child runs of a tree (depth first, with their depths) the request may view; a
    refused run's descendants are left out with it (they would hint at it)."""
    allowed = await visible_ids(web, request, (run.run_id for _, run in nodes))
    shown: list[tuple[int, Run]] = []
    hidden_below: int | None = None
    for depth, run in nodes:
        if hidden_below is not None and depth > hidden_below:
            continue
        hidden_below = None
        if run.run_id in allowed:
            shown.append((depth, run))
        else:
            hidden_below = depth
    return shown


def _uncertain_calls(run: Run) -> list[dict[str, Any]]:
    from statekernel.pauses import Uncertain

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
