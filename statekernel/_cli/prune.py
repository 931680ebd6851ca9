"""``statekernel runs prune``: delete old runs with all their parts (``Kernel.prune``)."""

from __future__ import annotations

import re
import sys
from datetime import timedelta

import click

from statekernel import STATE_IDS, PruneResult, StateId
from statekernel._cli.common import Output, UserError, common_options, open_cli_kernel, run_async
from statekernel._front.reach import DEFAULT_STATES, states_of
from statekernel._front.visible import visible
from statekernel.errors import InvalidArgument

__all__ = ["parse_age", "prune"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` as a ``timedelta``; ``UserError``
    otherwise."""
    match = _AGE.match(text)
    if match is None:
        raise UserError(
            f"--older-than {text!r} is not an age: give a number and a unit, "
            "s, m, h, d or w (30d, 12h)"
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def _states(text: str | None) -> tuple[StateId, ...]:
    if text is None:
        return DEFAULT_STATES
    try:
        return states_of([s.strip() for s in text.split(",") if s.strip()])
    except InvalidArgument as exc:
        raise UserError(f"--state {text!r}: {exc}") from None


@click.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help="Runs last updated longer ago than this: 30d, 12h, 90m, 45s, 2w.",
)
@click.option(
    "--state",
    "state",
    metavar="STATES",
    help=f"Comma-separated states (default: {','.join(DEFAULT_STATES)}; "
    f"any of {', '.join(STATE_IDS)}).",
)
@click.option("--dry-run", is_flag=True, help="Delete nothing: list what would be deleted.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--batch",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Runs listed (and deleted) per round.",
)
@common_options
def prune(
    older_than: str,
    state: str | None,
    dry_run: bool,
    yes: bool,
    batch: int,
    store: str | None,
    as_json: bool,
) -> None:
    """Delete old runs with all their parts: their revisions, events and child runs.

    A child run goes with its parent, never alone. A run that a process holds (drives,
    deletes) is skipped, not waited for, and named. Without --yes the command asks
    first; where nobody can answer (no terminal, or --json) it refuses.
    """
    age = parse_age(older_than)
    states = _states(state)
    what = f"runs in state {','.join(states)} last updated more than {older_than} ago"
    if not (yes or dry_run):
        if as_json or not sys.stdin.isatty():
            raise UserError(
                f"not deleting {what}: nobody can confirm it here "
                "(no terminal, or --json); pass --yes, or --dry-run to see them"
            )
        click.confirm(f"delete {what}, with their child runs and all their data?", abort=True)

    async def go() -> PruneResult:
        async with open_cli_kernel(store) as kernel:
            return await kernel.prune(older_than=age, states=states, dry_run=dry_run, batch=batch)

    result = run_async(go())
    out = Output(as_json)
    if as_json:
        out.json(result)
        return
    verb = "would delete" if dry_run else "deleted"
    for run_id in result.deleted if dry_run else ():
        out.console.print(visible(run_id), markup=False)
    out.console.print(visible(f"{verb} {len(result.deleted)} run(s): {what}"), markup=False)
    for run_id in result.held:
        out.errors.print(visible(f"skipped run {run_id}: a process holds it"), markup=False)
