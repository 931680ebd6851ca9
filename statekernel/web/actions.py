"""The actions: answer or approve a pause, raise a reached limit and resume, resolve an
uncertain call, send a message, retry, cancel, fork at a revision, delete. Each is a POST
carrying the page's CSRF token, authorized by the ``authorize`` hook (both before its body
is read), done by the acting kernel; a run that goes on afterwards is driven in the
background, and its page follows it live.

A refused action answers a page saying why in one line (a run another process holds:
busy, owned by whom), never a stack trace.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from statekernel import Kernel, Run
from statekernel._front.limits import (
    check_raised,
    limit_is_float,
    limit_reached,
    parse_limit_value,
    raised_limits,
)
from statekernel.errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidArgument,
    InvalidTransition,
    RunBusy,
    RunHasChildren,
    RunNotFound,
    StatekernelError,
)
from statekernel.web.bodies import read_form
from statekernel.web.context import WebContext, log
from statekernel.web.forms import read_answer
from statekernel.web.links import path_for
from statekernel.web.notes import note_query
from statekernel.web.numbers import decimal_number, whole_number
from statekernel.web.pages import forbidden
from statekernel.web.rendering import renderer_of
from statekernel.web.security import sent_token
from statekernel.web.views import question_of

__all__ = ["ACTIONS", "act", "refusal"]


def refusal(exc: StatekernelError) -> tuple[int, str]:
    """The status and one-line message of an action the kernel refused."""
    if isinstance(exc, RunBusy):
        return 409, f"busy: run {exc.run_id} is owned by {exc.owner}, which is driving it"
    if isinstance(exc, ConflictError):
        return 409, f"run {exc.run_id} moved on in another process: reload and try again"
    if isinstance(exc, RunNotFound):
        return 404, str(exc)
    if isinstance(exc, RunHasChildren):
        return 409, str(exc)
    if isinstance(exc, CorruptCheckpoint):
        return 409, f"the run is damaged: {exc}"
    if isinstance(exc, InvalidArgument | InvalidTransition):
        return 400, str(exc)
    return 400, f"{type(exc).__name__}: {exc}"


Act = Callable[[Kernel, str, FormData], Awaitable[tuple[str, str | None]]]
"""An action: does it, returns (what it did, the run to show next or None for the
list)."""


async def _answer(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    run = await kernel.get(run_id)
    question = question_of(run)
    if question is None:
        raise InvalidTransition("answer", run.state, "the run asks no question")
    value = read_answer(question.asked.schema, {k: str(v) for k, v in form.items()})
    await kernel.resume(run_id, value=value)
    return "answered; the run goes on", run_id


async def _resume(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    """With ``value`` (JSON, else text) or, explicitly, ``no_value=on``: an empty form is
    refused, since a hook reading the value (an approval) would pause the run again."""
    text = str(form.get("value", "")).strip()
    without = form.get("no_value") == "on"
    if not text and not without:
        raise InvalidArgument(
            "no value given: type the value the run waits for (JSON or text), or tick "
            "'resume without a value' (a hook that reads it, such as an approval, "
            "pauses the run again)"
        )
    if text and without:
        raise InvalidArgument("a value and 'resume without a value' both given: clear one of them")
    if without:
        await kernel.resume(run_id)
        return "resumed without a value; the run goes on", run_id
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = text
    await kernel.resume(run_id, value=value)
    return "resumed; the run goes on", run_id


async def _raise_limit(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    """Set the limit ``limit`` (by default the one the run reached) to ``value`` and resume
    the run, its other limits kept; a value not above what it used is refused."""
    run = await kernel.get(run_id)
    reached = limit_reached(run)
    if reached is None:
        raise InvalidTransition("resume", run.state, "the run is not paused at a limit")
    name = str(form.get("limit", "")) or reached.limit
    text = str(form.get("value", "")).strip()
    number = decimal_number if limit_is_float(name) else whole_number  # the view's syntax
    number(text, "value")
    changes = {name: parse_limit_value(name, text)}
    check_raised(run, changes)
    await kernel.resume(run_id, limits=raised_limits(run.limits, changes))
    return f"raised limit {name} to {changes[name]}; the run goes on", run_id


async def _resolve(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    call_id = str(form.get("call_id", ""))
    how = form.get("how")
    text = str(form.get("text", ""))
    run: Run
    if how == "output":
        try:
            output: Any = json.loads(text)
        except ValueError:
            output = text
        run = await kernel.resolve_tool_call(run_id, call_id, output=output)
    elif how == "error":
        run = await kernel.resolve_tool_call(run_id, call_id, error=text or "failed")
    elif how == "rerun":
        run = await kernel.resolve_tool_call(run_id, call_id, rerun=True)
    else:
        which = f"call {call_id}" if call_id else "the call"
        raise InvalidArgument(
            f"say what happened to {which}: it ran and returned an output, it failed "
            "with an error, or it did not run (run it again)"
        )
    if run.state == "paused":
        return f"resolved {call_id}; the run still waits for other calls", run_id
    return f"resolved {call_id}; the run goes on", run_id


async def _send(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    text = str(form.get("text", "")).strip()
    if not text:
        raise InvalidArgument("the message is empty")
    await kernel.send(run_id, text)
    return "sent; the run goes on", run_id


async def _retry(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    await kernel.retry(run_id)
    return "retried; the run goes on", run_id


async def _fork(kernel: Kernel, run_id: str, form: FormData) -> tuple[str, str | None]:
    text = str(form.get("revision", ""))
    revision = whole_number(text, "revision") if text else None
    run = await kernel.fork(run_id, at_revision=revision)
    at = f"revision {revision}" if revision is not None else "its head"
    return f"forked {run_id} at {at} into {run.run_id}", run.run_id


async def _cancel(
    kernel: Kernel,
    run_id: str,
    form: FormData,
    approve: Callable[[list[str]], Awaitable[None]] | None = None,
) -> tuple[str, str | None]:
    """Cancel the run (with its child runs unless ``children`` is off; ``approve`` sees
    their ids first and raises to cancel nothing)."""
    children = form.get("children", "on") == "on"
    if children and approve is not None:
        tree = await kernel.tree(run_id)
        await approve([run.run_id for _, run in tree])
    reason = str(form.get("reason", "")).strip()
    result = await kernel.cancel(run_id, reason, children=children)
    more = sum(1 for c in result.children if c.outcome != "unchanged")
    also = f" and {more} child run(s)" if more else ""
    return f"{result.outcome}: run {run_id}{also} ({result.detail})", run_id


class _ChildRefused(Exception):
    """The ``authorize`` hook refused deleting one of the run's child runs."""


async def _delete(
    kernel: Kernel,
    run_id: str,
    form: FormData,
    approve: Callable[[list[str]], Awaitable[None]] | None = None,
) -> tuple[str, str | None]:
    """With children, ``approve`` sees the whole tree once the kernel holds every run of
    it, so no child run started after the check is deleted unasked."""
    if form.get("confirm") != run_id:
        raise InvalidArgument(f"type the run id ({run_id}) to confirm the deletion")
    children = form.get("children") == "on"
    deleted = await kernel.delete(run_id, children=children, approve=approve)
    if not deleted:
        raise RunNotFound(run_id)
    more = len(deleted) - 1
    return f"deleted run {run_id}" + (f" and {more} child run(s)" if more else ""), None


ACTIONS: dict[str, tuple[Act, bool]] = {
    "answer": (_answer, True),
    "resume": (_resume, True),
    "raise_limit": (_raise_limit, True),
    "resolve": (_resolve, True),
    "send": (_send, True),
    "retry": (_retry, True),
    "cancel": (_cancel, False),
    "fork": (_fork, False),
    "delete": (_delete, False),
}
"""Each action, and whether the run is driven to rest after it."""


async def act(request: Request) -> Response:
    """``POST /runs/{run_id}/{action}``: the action's name, its CSRF token (in the
    query string or a header) and the ``authorize`` hook are checked before its form
    is read (bounded: ``read_form``)."""
    run_id = request.path_params["run_id"]
    name = request.path_params["action"]
    web: WebContext = request.app.state.web
    renderer = renderer_of(request)

    def refused(status: int, message: str) -> Response:
        context = {"title": "Not done", "message": message, "run_id": run_id}
        return renderer.page(request, "error.html", context, status=status)

    if name not in ACTIONS:
        return refused(404, f"no action {name!r}")
    if not web.csrf.check(request, sent_token(request)):
        return refused(403, "the CSRF token is missing or wrong: reload the page")
    if (denied := await forbidden(request, name, run_id)) is not None:
        return denied
    if web.actor is None:
        return refused(403, web.read_only_reason or "read-only")
    form = await read_form(request)
    work, drive = ACTIONS[name]
    if name in ("delete", "cancel"):

        async def each_child_allowed(tree: list[str]) -> None:
            # acting with children acts on each of them: each must be allowed on its own
            for child in tree[1:]:
                if not await web.authorized(request, name, child):
                    raise _ChildRefused

        work = functools.partial(
            _delete if name == "delete" else _cancel, approve=each_child_allowed
        )
    try:
        said, shown = await work(web.actor, run_id, form)
    except ConfigError:  # the authorize hook's own fault (its answer about a child run)
        raise
    except StatekernelError as exc:
        return refused(*refusal(exc))
    except _ChildRefused:
        done = "deleted" if name == "delete" else "cancelled"
        said = f"not allowed: {name} on a child run of run {run_id}; nothing was {done}"
        return renderer.page(
            request, "error.html", {"title": "Forbidden", "message": said}, status=403
        )
    if drive and shown is not None:
        try:
            run = await web.store.load(shown)
        except StatekernelError as exc:  # deleted or damaged meanwhile: its page says so
            log.warning("after %s on run %s: %s", name, shown, exc)
        else:
            if not run.is_terminal:
                web.drive(shown)
    target = (
        path_for(request, "run", run_id=shown) if shown is not None else path_for(request, "list")
    )
    return RedirectResponse(f"{target}?{note_query(web.csrf, said)}", status_code=303)
