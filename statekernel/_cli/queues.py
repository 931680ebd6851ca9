"""``statekernel queues``: look at the run queues of a store (their depth, entries and
dead letters), put dead letters back on their queue, drop entries."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import click
from rich.table import Table

from statekernel._cli.common import (
    Output,
    UserError,
    common_options,
    open_cli_store,
    run_async,
    store_url,
)
from statekernel._front.reach import checked_queue_name, queue_schemes
from statekernel._front.text import short
from statekernel._front.visible import visible
from statekernel.errors import InvalidArgument
from statekernel.stores import (
    DeadLetter,
    ListsQueues,
    QueueDepth,
    QueuedRun,
    redact_url,
)

__all__ = ["queues", "waited"]

T = TypeVar("T")


def waited(oldest_ms: int | None, now_ms: int | None = None) -> str:
    """How long the oldest entry has waited, for people: ``42s``, ``3m``, ``5h``, ``2d``
    (``-`` when nothing waits)."""
    if oldest_ms is None:
        return "-"
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    seconds = max(now - oldest_ms, 0) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _stamp(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _name(name: str) -> str:
    try:
        return checked_queue_name(name)
    except InvalidArgument as exc:
        raise UserError(str(exc)) from None


def _with_queues(
    store: str | None, work: Callable[[ListsQueues], Awaitable[T]], *, reading: bool = False
) -> T:
    """``work(store)`` on the store of ``--store``, refused when it has no run queues."""

    async def go() -> T:
        async with open_cli_store(store, reading=reading) as s:
            if not isinstance(s, ListsQueues):
                shown = redact_url(store_url(store))
                raise UserError(
                    f"the store {shown} has no run queues (only {queue_schemes()} have them)"
                )
            return await work(s)

    return run_async(go())


@click.group()
def queues() -> None:
    """Run queues: their depth, entries and dead letters (Redis and PostgreSQL stores)."""


@queues.command("list")
@common_options
def list_queues(store: str | None, as_json: bool) -> None:
    """The queues that hold entries or dead letters, with their depth: entries waiting,
    taken by a worker and not settled, dead letters, and how long the oldest entry that
    could be taken now has waited."""

    async def go(s: ListsQueues) -> list[QueueDepth]:
        return [await s.run_queue(name).depth() for name in await s.queue_names()]

    depths = _with_queues(store, go, reading=True)
    out = Output(as_json)
    now = int(time.time() * 1000)
    if as_json:
        out.json(
            [
                attrs.asdict(d)
                | {"oldest_wait_s": None if d.oldest_ms is None else (now - d.oldest_ms) / 1000}
                for d in depths
            ]
        )
        return
    if not depths:
        out.console.print("no queues")
        return
    table = Table(show_edge=False, header_style="bold")
    for column in ("queue", "waiting", "taken", "dead", "oldest wait"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for d in depths:
        table.add_row(d.name, str(d.waiting), str(d.taken), str(d.dead), waited(d.oldest_ms, now))
    out.console.print(table)


@queues.command("show")
@click.argument("name")
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Entries (and dead letters) shown at most, oldest entries and newest dead letters.",
)
@common_options
def show(name: str, limit: int, store: str | None, as_json: bool) -> None:
    """The entries of queue NAME (run, when it was submitted, deliveries, state, the
    worker holding it) and its dead letters (why the worker gave up)."""
    name = _name(name)

    async def go(s: ListsQueues) -> tuple[QueueDepth, list[QueuedRun], list[DeadLetter]]:
        queue = s.run_queue(name)
        return await queue.depth(), await queue.entries(limit), await queue.dead_letters(limit)

    depth, entries, dead = _with_queues(store, go, reading=True)
    out = Output(as_json)
    if as_json:
        out.json(
            {
                "queue": attrs.asdict(depth),
                "entries": [attrs.asdict(e) for e in entries],
                "dead_letters": [attrs.asdict(d) for d in dead],
            }
        )
        return
    said = (
        f"queue {name}: {depth.waiting} waiting, {depth.taken} taken, {depth.dead} dead, "
        f"oldest wait {waited(depth.oldest_ms)}"
    )
    out.console.print(visible(said), markup=False)
    table = Table(show_edge=False, header_style="bold")
    for column in ("run id", "state", "attempts", "enqueued", "worker", "reason"):
        table.add_column(column, no_wrap=column in ("run id", "enqueued"))
    rows: list[list[Any]] = [
        [e.run_id, e.state, e.deliveries, _stamp(e.submitted_ms), e.consumer or "", ""]
        for e in entries
    ]
    rows += [
        [d.run_id, "dead", "", _stamp(d.at_ms), d.worker, f"{d.reason}: {short(d.detail, 80)}"]
        for d in dead
    ]
    for row in rows:
        table.add_row(*(visible(str(cell)) for cell in row))
    out.console.print(table if rows else "no entries and no dead letters")


@queues.command("requeue")
@click.argument("name")
@click.argument("run_id", required=False)
@click.option("--all-dead", is_flag=True, help="Put back the runs of every dead letter.")
@common_options
def requeue(
    name: str, run_id: str | None, all_dead: bool, store: str | None, as_json: bool
) -> None:
    """Put the run RUN_ID of a dead letter of queue NAME back on the queue (or, with
    --all-dead, the runs of all its dead letters): one new entry per run, for the
    workers to take again, and the run's dead letters removed."""
    name = _name(name)
    if (run_id is None) == (not all_dead):
        raise UserError("give a RUN_ID or --all-dead (not both)")

    async def go(s: ListsQueues) -> int:
        return await s.run_queue(name).revive(run_id)

    count = _with_queues(store, go)
    if count == 0 and run_id is not None:
        raise UserError(f"queue {name!r} has no dead letter of run {run_id!r}")
    out = Output(as_json)
    if as_json:
        out.json({"queue": name, "run_id": run_id, "requeued": count})
        return
    which = f"run {run_id}" if run_id is not None else f"{count} run(s)"
    out.console.print(visible(f"put {which} back on queue {name}"), markup=False)


@queues.command("drop")
@click.argument("name")
@click.argument("run_id")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@common_options
def drop(name: str, run_id: str, yes: bool, store: str | None, as_json: bool) -> None:
    """Remove the entries of run RUN_ID from queue NAME, with its dead letters. An entry
    a worker has taken is left to it. The run itself is kept (``runs delete`` removes
    it). Without --yes the command asks first; where nobody can answer (no terminal, or
    --json) it refuses."""
    name = _name(name)
    what = f"the entries and dead letters of run {run_id!r} on queue {name!r}"
    if not yes:
        if as_json or not sys.stdin.isatty():
            raise UserError(
                f"not dropping {what}: nobody can confirm it here (no terminal, or --json);"
                " pass --yes"
            )
        click.confirm(visible(f"drop {what}?"), abort=True)

    async def go(s: ListsQueues) -> int:
        return await s.run_queue(name).drop(run_id)

    count = _with_queues(store, go)
    if count == 0:
        raise UserError(
            f"queue {name!r} holds no entry of run {run_id!r} that no worker has taken,"
            " and no dead letter of it"
        )
    out = Output(as_json)
    if as_json:
        out.json({"queue": name, "run_id": run_id, "dropped": count})
        return
    out.console.print(visible(f"dropped {count} from queue {name}: run {run_id}"), markup=False)
