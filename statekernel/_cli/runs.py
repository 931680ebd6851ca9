"""``statekernel runs ...``: list, inspect, follow, resume, send, resolve, submit, cancel,
fork, delete, prune, diagram."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from statekernel import STATE_IDS, CancelResult, Event, Kernel, Run, StateId, to_plain
from statekernel._cli.common import (
    Output,
    UserError,
    command_hint,
    common_options,
    open_cli_kernel,
    open_cli_store,
    run_async,
    run_hint,
    store_url,
    warnings_shown,
)
from statekernel._cli.drive import resume_run, send_run, summary_line
from statekernel._cli.prune import prune
from statekernel._cli.view import (
    EventPrinter,
    run_details,
    run_tree_view,
    runs_table,
    tree_node,
)
from statekernel._front.agents import load_agent
from statekernel._front.limits import parse_limit
from statekernel._front.reach import (
    FORMATS,
    Owner,
    driven,
    owner_of,
    owners_of,
    parse_tag,
    queue_schemes,
)
from statekernel._front.visible import visible
from statekernel.errors import InvalidArgument, InvalidTag, RunNotFound, StoreError
from statekernel.stores import (
    CheckpointStore,
    LiveFeed,
    RunQueues,
    RunSummary,
    Watches,
    live_feed,
    redact_url,
)

__all__ = ["runs"]


@click.group()
def runs() -> None:
    """Inspect and act on stored runs."""


def _exit_for(run: Run) -> None:
    if run.state == "failed":
        sys.exit(1)


# -- list / show -------------------------------------------------------------------


@runs.command("list")
@click.option("--state", type=click.Choice(STATE_IDS), help="Only runs in this state.")
@click.option("--root", help="Only this run and its child runs (delegations), at any depth.")
@click.option(
    "--tag",
    "tag_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only runs with this tag (repeat it: runs with every tag given).",
)
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@common_options
def list_runs(
    state: StateId | None,
    root: str | None,
    tag_args: tuple[str, ...],
    limit: int,
    store: str | None,
    as_json: bool,
) -> None:
    """List runs, most recently updated first.

    A run whose stored head cannot be read is left out and named on stderr (and, with
    --json, listed after the others as ``{"run_id": ..., "damaged": problem}``).
    """

    damaged: dict[str, str] = {}
    owners: dict[str, Owner] = {}
    tags = tag_filter(tag_args)

    async def go() -> list[RunSummary]:
        async with open_cli_kernel(store, reading=True) as kernel:
            rows = await listed(kernel)
            if not as_json:  # who drives the runs not at rest, asked of those alone
                asked = ((r.run_id, r.state, r.revision) for r in rows)
                owners.update(await owners_of(kernel.store, asked))
            return rows

    async def listed(kernel: Kernel) -> list[RunSummary]:
        if root is not None:
            tree = [RunSummary.of(run) for _, run in await kernel.tree(root)]
            tree = [row for row in tree if state is None or row.state == state]
            tree = [row for row in tree if row.tags.items() >= tags.items()]
            return sorted(tree, key=lambda row: row.updated_at, reverse=True)[:limit]
        rows: list[RunSummary] = []
        cursor = None
        while len(rows) < limit:
            page = await kernel.store.list_runs(
                state=state, limit=limit - len(rows), cursor=cursor, tags=tags or None
            )
            rows.extend(page.runs)
            damaged.update((d.run_id, d.problem) for d in page.damaged)
            cursor = page.next_cursor
            if cursor is None:
                break
        return rows

    rows = run_async(go())
    out = Output(as_json)
    for run_id, problem in damaged.items():
        out.errors.print(visible(f"skipped damaged run {run_id}: {problem}"), markup=False)
    if as_json:  # damaged runs follow the listed ones, each with its problem
        out.json([*rows, *({"run_id": r, "damaged": p} for r, p in damaged.items())])
    elif rows:
        out.console.print(runs_table(rows, owners))
    else:
        with_tags = " ".join(f"{k}={v}" for k, v in tags.items())
        out.console.print(
            "no runs"
            + (f" in state {state}" if state else "")
            + (f" tagged {with_tags}" if tags else "")
        )


def tag_filter(args: tuple[str, ...]) -> dict[str, str]:
    """The ``--tag KEY=VALUE`` options as one filter; a malformed one is a ``UserError``."""
    tags: dict[str, str] = {}
    try:
        for arg in args:
            key, value = parse_tag(arg)
            if tags.get(key, value) != value:
                raise InvalidTag(f"--tag {key} is given twice, {tags[key]!r} and {value!r}")
            tags[key] = value
    except InvalidTag as exc:
        raise UserError(f"--tag: {exc}") from None
    return tags


@runs.command("tree")
@click.argument("run_id")
@common_options
def tree(run_id: str, store: str | None, as_json: bool) -> None:
    """Show a run and its child runs (delegations), as a tree."""

    async def go() -> list[tuple[int, Run]]:
        async with open_cli_kernel(store, reading=True) as kernel:
            return await kernel.tree(run_id)

    nodes = run_async(go())
    out = Output(as_json)
    if as_json:
        out.json([tree_node(depth, run) for depth, run in nodes])
    else:
        out.console.print(run_tree_view(nodes))


@runs.command("show")
@click.argument("run_id")
@click.option("--revision", type=click.IntRange(0), help="Show the run as it was at this revision.")
@click.option("--full", is_flag=True, help="Do not shorten long messages.")
@common_options
def show(run_id: str, revision: int | None, full: bool, store: str | None, as_json: bool) -> None:
    """Show a run: state, context, transcript, tool calls in progress, usage."""

    owner: Owner | None = None

    async def go() -> Run:
        nonlocal owner
        async with open_cli_store(store, reading=True) as s:
            try:
                run = await s.load(run_id, revision=revision)
                if revision is None and not as_json:  # who drives it now, read only
                    owner = await owner_of(s, run_id, run.state, run.revision)
                return run
            except RunNotFound:
                if revision is None:
                    raise
                head = await s.load(run_id)  # RunNotFound when the run itself is missing
                raise UserError(
                    f"run {run_id} has no revision {revision} (its head is at revision "
                    f"{head.revision})"
                ) from None

    run = run_async(go())
    out = Output(as_json)
    if as_json:
        data = to_plain(run)
        if run.output_spec is not None and run.state == "completed":
            data["output"] = run.output  # the typed final answer, as JSON
        out.json(data)
    else:
        out.console.print(run_details(run, limit=1_000_000 if full else 300, owner=owner))
        if owner is not None and not owner.alive:  # nothing drives it: say how to go on
            hint = command_hint(f"statekernel runs resume {run.run_id}", store)
            out.note(visible(f"to take the run over and go on with it: {hint}"), markup=False)


# -- events ------------------------------------------------------------------------

IDLE_NOTE_AFTER = 3.0
"""Seconds without a new event after which ``events --follow`` looks whether someone
drives the run (reading only: a reader never takes a lease, on a store opened
read-only or any other)."""


async def _driven(store: CheckpointStore, run_id: str) -> bool | None:
    """Whether a live owner holds the run's lease, read without writing (None: the
    store cannot tell, or cannot now: its owners' lock files are not readable here)."""
    try:
        return await driven(store, run_id)
    except StoreError:
        return None


def _idle_note(run: Run, driven: bool | None, store: str | None) -> str | None:
    """What ``events --follow`` says of a run that has been quiet for a while: nothing
    while a live owner drives it; a hint to resume it when nobody does, or when the
    store cannot tell (``driven`` None)."""
    if driven:
        return None
    hint = command_hint(f"statekernel runs resume {run.run_id}", store)
    where = f"run {run.run_id} is in {run.state} at revision {run.revision}"
    if driven is None:
        return (
            f"{where} and has committed nothing for {IDLE_NOTE_AFTER:.0f} s; if no process"
            f" drives it any more (its last owner stopped or died): {hint}"
        )
    return f"{where} and no process drives it (its last owner stopped or died): {hint}"


@runs.command("events")
@click.argument("run_id")
@click.option("--after", type=int, default=-1, help="Only events of revisions after this one.")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new events until the run comes to rest."
)
@click.option("--interval", type=click.FloatRange(0.01), default=0.5, show_default=True)
@common_options
def events(
    run_id: str, after: int, follow: bool, interval: float, store: str | None, as_json: bool
) -> None:
    """Print a run's persisted events (JSON lines with --json); with --follow, also
    its live events (text deltas ...) as the process that drives it sends them, on a
    store with a feed of its own (Redis, PostgreSQL)."""
    out = Output(as_json)
    printer = EventPrinter(out.console, live=follow)

    async def go() -> None:
        async with open_cli_store(store, reading=True) as s:
            if not follow or not isinstance(s, Watches):
                await printing(s, None)
                return
            async with live_feed(s, run_id) as feed:
                await printing(s, feed)

    def show(event: Event) -> None:
        if as_json:
            out.json(event, lines=True)
        else:
            printer.show(event)

    async def printing(s: CheckpointStore, feed: LiveFeed | None) -> None:
        """Print the new events, then wait for the next commit (a notice from a store
        with a feed of its own, printing live events meanwhile, else ``interval``)
        while following."""
        nonlocal after
        loop = asyncio.get_running_loop()
        quiet_since, told = loop.time(), False
        while True:
            committed = await s.events(run_id, after_revision=after)
            while feed is not None and (live := feed.take()) is not None:
                show(live)  # sent before those commits
            for event in committed:
                show(event)
                after = max(after, event.revision)
                quiet_since, told = loop.time(), False
            if not follow:
                return
            run = await s.load(run_id)
            if run.is_terminal and run.revision <= after:
                return
            if not told and loop.time() - quiet_since >= IDLE_NOTE_AFTER:
                told = True
                note = _idle_note(run, await _driven(s, run_id), store)
                if note is not None:
                    out.note(visible(note), markup=False)
            if feed is None:
                await asyncio.sleep(interval)
            else:  # a notice, or a look now and then all the same (notices may be missed)
                while (live := await feed.next(max(interval, IDLE_NOTE_AFTER))) is not None:
                    show(live)

    run_async(go())


# -- resume / resolve --------------------------------------------------------------


@runs.command("resume")
@click.argument("run_id")
@click.option("--max-turns", type=click.IntRange(1), help="Raise the turn budget of a paused run.")
@click.option(
    "--limit",
    "limits",
    metavar="NAME=VALUE",
    multiple=True,
    callback=lambda _ctx, _param, given: limit_changes(given),
    help="Raise (or set) one usage limit of a paused run, keeping its others "
    "(repeatable): NAME is a field of statekernel.Limits, such as tool_calls=50.",
)
@click.option(
    "--value",
    "value",
    metavar="JSON",
    help="What a paused run waits for (an approval, an answer), as JSON: its hooks read "
    "it as run.resume_value. Text is a JSON string: --value '\"yes\"'.",
)
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="Kernel arguments (tools, hooks, providers) for a run started by your application.",
)
@common_options
def resume(
    run_id: str,
    max_turns: int | None,
    limits: dict[str, int | float],
    value: str | None,
    agent: str | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Continue a run from its last commit until it is paused, failed or completed.

    A paused run is resumed, a failed one retried, an interrupted one (the process
    died) picked up where it stopped. ``--limit`` raises the limits of a run paused
    with ``limit_reached``. Demo runs get the demo's tools and model; other
    runs get the tools, hooks and providers of ``--agent package.module:function``
    (a function returning ``Kernel`` keyword arguments), or run without tools.
    """
    out = Output(as_json)
    options = load_agent(agent)

    given = () if value is None else (_json_value(value),)

    async def go() -> Run:
        async with open_cli_store(store) as s:
            return await resume_run(
                s,
                run_id,
                out,
                max_turns=max_turns,
                limits=limits,
                value=given,
                agent=options,
                store_flag=store,
                agent_flag=agent,
            )

    with warnings_shown():
        run = run_async(go())
    out.note(summary_line(run, store, agent), markup=False)
    _exit_for(run)


@runs.command("send")
@click.argument("run_id")
@click.argument("text")
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="Kernel arguments (tools, hooks, providers) for a run started by your application.",
)
@common_options
def send(run_id: str, text: str, agent: str | None, store: str | None, as_json: bool) -> None:
    """Add a user message to a run at rest and continue it until it rests again."""
    out = Output(as_json)
    options = load_agent(agent)

    async def go() -> Run:
        async with open_cli_store(store) as s:
            return await send_run(
                s, run_id, text, out, agent=options, store_flag=store, agent_flag=agent
            )

    with warnings_shown():
        run = run_async(go())
    out.note(summary_line(run, store, agent), markup=False)
    _exit_for(run)


def limit_changes(given: tuple[str, ...]) -> dict[str, int | float]:
    """The ``--limit NAME=VALUE`` options as the limits to set; a bad one is a usage error
    naming it (the limits a run can have are named)."""
    changes: dict[str, int | float] = {}
    for text in given:
        try:
            name, value = parse_limit(text)
        except InvalidArgument as exc:
            raise click.BadParameter(str(exc), param_hint="--limit") from None
        if changes.get(name, value) != value:
            raise click.BadParameter(
                f"{name} is given twice, {changes[name]} and {value}", param_hint="--limit"
            )
        changes[name] = value
    return changes


def _json_value(text: str) -> Any:
    """``--value`` as JSON; text that is not JSON is refused rather than guessed at."""
    try:
        return json.loads(text)
    except ValueError:
        quoted = json.dumps(text, ensure_ascii=False)
        raise UserError(
            f"--value {text!r} is not JSON: give text as a JSON string, --value {quoted!r}"
        ) from None


def _parse_output(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@runs.command("resolve")
@click.argument("run_id")
@click.argument("call_id")
@click.option("--output", "output", metavar="JSON", help="The call ran and returned this.")
@click.option("--error", "error", metavar="TEXT", help="The call failed with this error.")
@click.option("--rerun", is_flag=True, help="Run the call again.")
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="Kernel arguments (tools, hooks, providers) of the run's application; the resume "
    "command suggested carries it.",
)
@common_options
def resolve(
    run_id: str,
    call_id: str,
    output: str | None,
    error: str | None,
    rerun: bool,
    agent: str | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Say what happened to a tool call a crash left uncertain.

    --output is parsed as JSON when it is valid JSON, else taken as a string.
    When every uncertain call is resolved the run leaves 'paused'; continue it
    with `statekernel runs resume RUN_ID`.
    """
    if (output is not None) + (error is not None) + rerun != 1:
        raise UserError("give exactly one of --output, --error or --rerun")
    options = load_agent(agent)

    async def go() -> Run:
        async with open_cli_kernel(store, **options) as kernel:
            if output is not None:
                return await kernel.resolve_tool_call(run_id, call_id, output=_parse_output(output))
            return await kernel.resolve_tool_call(run_id, call_id, error=error, rerun=rerun)

    with warnings_shown():
        run = run_async(go())
    out = Output(as_json)
    if as_json:
        out.json(run)
    elif run.state == "paused":
        said = f"resolved {call_id}; run {run_id} still waits for other calls"
        out.console.print(visible(said), markup=False)
    else:
        said = (
            f"resolved {call_id}; run {run_id} is back in {run.state}: continue it with: "
            + run_hint("resume", run_id, store, agent)
        )
        out.console.print(visible(said), markup=False)


# -- submit ------------------------------------------------------------------------


@runs.command("submit")
@click.argument("run_id")
@click.option("--queue", default="default", show_default=True, help="Run queue to put it on.")
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Seconds before a worker may take it (the store's clock).",
)
@click.option("--key", help="A key (a tenant, a user): see --key-limit.")
@click.option(
    "--key-limit",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs of --key in flight on the queue at most.",
)
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="The run's application (tools, hooks, providers): the worker command suggested "
    "carries it.",
)
@common_options
def submit(
    run_id: str,
    queue: str,
    delay: float,
    key: str | None,
    key_limit: int,
    agent: str | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Hand a run to the workers of a run queue (``statekernel worker --queue``).

    Needs a store with run queues (Redis or PostgreSQL). The run goes on in whichever
    worker takes it: one driving it now waits for this process's owner to let it go.
    """
    load_agent(agent)  # checked now: the command suggested must work as printed

    async def go() -> tuple[str, Run]:
        async with open_cli_store(store) as s:
            if not isinstance(s, RunQueues):
                shown = redact_url(store_url(store))
                raise UserError(
                    f"the store {shown} has no run queues: runs submit needs a store with"
                    f" run queues ({queue_schemes()})"
                )
            run = await s.load(run_id)  # RunNotFound before anything is queued
            async with Kernel(s) as kernel:
                entry = await kernel.submit(
                    run_id, queue=queue, delay=delay, key=key, key_limit=key_limit
                )
                return entry, run

    entry, run = run_async(go())
    out = Output(as_json)
    if as_json:
        out.json({"run_id": run_id, "queue": queue, "entry": entry, "state": run.state})
        return
    said = f"submitted run {run_id} ({run.state} at revision {run.revision}) to queue {queue!r}"
    if delay:
        said += f", to be taken in {delay:g} s"
    out.console.print(visible(said), markup=False)
    hint = command_hint("statekernel worker", store, agent, queue=queue)
    out.console.print(visible(f"a worker drives it: {hint}"), markup=False)


@runs.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="", help="Why: kept as the failure's message.")
@click.option("--by", default=None, help="Who asks (default: this process's kernel id).")
@click.option(
    "--without-children", is_flag=True, help="Leave its child runs running (default: cancel them)."
)
@common_options
def cancel(
    run_id: str,
    reason: str,
    by: str | None,
    without_children: bool,
    store: str | None,
    as_json: bool,
) -> None:
    """Stop a run, from any machine: it ends failed with a Cancelled failure that
    ``runs resume`` retries. A run that a process drives is stopped by that process at its
    next safe point (no call starts after the cancel); a run at rest is cancelled at once.
    Exit 0 when the run is cancelled or will be, also when it was already."""

    async def go() -> CancelResult:
        async with open_cli_kernel(store) as kernel:
            return await kernel.cancel(run_id, reason, by=by, children=not without_children)

    with warnings_shown():
        result = run_async(go())
    out = Output(as_json)
    if as_json:
        out.json(to_plain(result))
        return
    for line in _cancel_lines(result, 0):
        out.console.print(visible(line), markup=False)


def _cancel_lines(result: CancelResult, depth: int) -> list[str]:
    lines = [f"{'  ' * depth}run {result.run_id}: {result.outcome} ({result.detail})"]
    for child in result.children:
        lines += _cancel_lines(child, depth + 1)
    return lines


# -- fork / delete -----------------------------------------------------------------


@runs.command("fork")
@click.argument("run_id")
@click.option("--at", "at", type=click.IntRange(0), help="Revision to fork from (default: head).")
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="The run's application (tools, hooks, providers): the resume command suggested "
    "carries it.",
)
@common_options
def fork(run_id: str, at: int | None, agent: str | None, store: str | None, as_json: bool) -> None:
    """Start a new, independent run from a run as it was at a revision."""
    load_agent(agent)  # checked now: the command suggested must work as printed

    async def go() -> Run:
        async with open_cli_kernel(store) as kernel:
            return await kernel.fork(run_id, at_revision=at)

    run = run_async(go())
    out = Output(as_json)
    if as_json:
        out.json({"run_id": run.run_id, "from_run_id": run_id, "state": run.state})
    else:
        out.console.print(visible(f"forked {run_id} -> {run.run_id} ({run.state})"), markup=False)
        hint = run_hint("resume", run.run_id, store, agent)
        out.console.print(visible(f"continue it with: {hint}"), markup=False)


@runs.command("delete")
@click.argument("run_id")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--with-children", is_flag=True, help="Delete its child runs too, at any depth.")
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Seconds to wait for a process that drives the run to let it go (then exit 2).",
)
@common_options
def delete(
    run_id: str, yes: bool, with_children: bool, wait: float, store: str | None, as_json: bool
) -> None:
    """Delete a run with all its revisions and events (a run with child runs only with
    --with-children). A run that another process drives is waited for, never cut off."""
    what = " and its child runs" if with_children else ""
    if not yes:
        if as_json or not sys.stdin.isatty():
            raise UserError(
                f"not deleting run {run_id}{what}: nobody can confirm it here "
                "(no terminal, or --json); pass --yes"
            )
        click.confirm(f"delete run {run_id}{what} and all their data?", abort=True)

    async def go() -> list[str]:
        async with open_cli_kernel(store, busy_timeout=wait) as kernel:
            return await kernel.delete(run_id, children=with_children)

    with warnings_shown():
        deleted = run_async(go())
    if not deleted:
        raise UserError(str(RunNotFound(run_id)))
    out = Output(as_json)
    if as_json:
        out.json({"run_id": run_id, "deleted": True, "runs": deleted})
    else:
        more = len(deleted) - 1
        said = f"deleted run {run_id}" + (f" and {more} child run(s)" if more else "")
        out.console.print(visible(said), markup=False)


# -- diagram -----------------------------------------------------------------------


@runs.command("diagram")
@click.argument("run_id")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="File to write (.svg, .dot or .mmd; '-' for stdout). Default: RUN_ID.svg.",
)
@common_options
def diagram(run_id: str, output: str | None, store: str | None, as_json: bool) -> None:
    """Draw the lifecycle with the states and transitions this run went through."""
    target = output or f"{run_id}.svg"
    fmt = "svg" if target == "-" else Path(target).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UserError(f"cannot tell the format of {target!r}: use .svg, .dot or .mmd")

    async def go() -> bytes:
        async with open_cli_kernel(store, reading=True) as kernel:
            return await kernel.diagram(run_id, format=fmt)

    data = run_async(go())
    if target == "-":
        sys.stdout.buffer.write(data)
        return
    Path(target).write_bytes(data)
    out = Output(as_json)
    if as_json:
        out.json({"run_id": run_id, "path": target, "format": fmt})
    else:
        out.console.print(f"wrote {target}")


runs.add_command(prune)
