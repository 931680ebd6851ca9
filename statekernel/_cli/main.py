"""The ``statekernel`` command: demo, run inspection and resume, migrate, diagrams.

Exit status: 0 when the command did what was asked; 1 when a run it drove failed, an
internal error, a check that found something (``diagram --check``) or a confirmation
answered no; 2 for a mistake (unknown run, bad option or store URL, unreachable store,
a run that cannot do what was asked), printed as one line on stderr (one JSON object
with ``--json``); 130 when interrupted (Ctrl-C).
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from statekernel import PERSISTED_EVENTS, Run
from statekernel._cli.common import (
    Output,
    UserError,
    check_existing_store,
    common_options,
    debug_enabled,
    one_line,
    open_cli_store,
    run_async,
    show_error,
    store_url,
)
from statekernel._cli.doctor import doctor
from statekernel._cli.drive import CrashPoint, checked_model, drive, summary_line
from statekernel._cli.queues import queues
from statekernel._cli.runs import runs
from statekernel._cli.ui import ui
from statekernel._cli.worker import worker
from statekernel._front.reach import DIAGRAM_NAME, FORMATS, can_render_svg, write_diagrams
from statekernel._front.visible import visible
from statekernel.errors import ConflictError, CorruptCheckpoint, StatekernelError
from statekernel.stores import redact_url

__all__ = ["cli", "main"]


class _Group(click.Group):
    """Turns library and OS errors into one-line user errors (exit 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StatekernelError as exc:
            raise UserError(str(exc) or type(exc).__name__) from exc
        except OSError as exc:
            raise UserError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="statekernel")
def cli() -> None:
    """statekernel: durable run loops for LLM agents.

    Try `statekernel demo`, then `statekernel runs list`.
    """


cli.add_command(runs)
cli.add_command(queues)
cli.add_command(worker)
cli.add_command(doctor)
cli.add_command(ui)


# -- demo --------------------------------------------------------------------------


def _crash_point(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> CrashPoint | None:
    if value is None:
        return None
    event, _, nth = value.partition(":")
    if event not in PERSISTED_EVENTS:
        known = ", ".join(sorted(PERSISTED_EVENTS))
        raise click.BadParameter(f"{event!r} is not a persisted event type (one of: {known})")
    if nth and not (nth.isdigit() and int(nth) >= 1):
        raise click.BadParameter("the occurrence after ':' must be a positive number")
    return CrashPoint(event, int(nth or 1))


@cli.command()
@click.option("--model", metavar="PROVIDER/NAME", help="Model to use (default: local or scripted).")
@click.option(
    "--crash-after",
    "crash",
    metavar="EVENT[:N]",
    callback=_crash_point,
    help="Kill the process right after the Nth (default first) persisted EVENT, "
    "e.g. tool_call_started.",
)
@click.option("--run-id", help="Id of the new run (default: random).")
@common_options
def demo(
    model: str | None,
    crash: CrashPoint | None,
    run_id: str | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Run a small agent with two tools, durably, streaming its events.

    The agent checks the weather (an idempotent tool) and books a table (a tool
    that must not run twice). Works offline with no keys: on the local model when
    `statekernel[local]` is installed, else on a scripted model. With
    --crash-after the process dies mid-run; `statekernel runs resume ID` finishes it.
    """
    # the demo defines its tools when imported (their schemas checked): only for this command
    from statekernel._cli.demo import (
        SCRIPTED_MODEL,
        default_demo_model,
        demo_context,
        demo_kernel,
        demo_messages,
    )

    out = Output(as_json)
    chosen = model or default_demo_model()

    async def go() -> Run:
        async with open_cli_store(store, existing=False) as s, demo_kernel(s) as kernel:
            checked_model(kernel, chosen)
            run = await kernel.start(
                model=chosen,
                messages=demo_messages(chosen),
                context=demo_context(),
                run_id=run_id,
            )
            where = redact_url(store_url(store))
            shown = escape(visible(run.run_id))
            out.note(f"demo run [bold]{shown}[/bold] on {escape(chosen)} (store {where})")
            return await drive(kernel, run.run_id, out, crash=crash, store=store)

    run = run_async(go())
    out.note(summary_line(run, store), markup=False)
    if crash is not None:
        out.note(
            f"[yellow]note:[/yellow] the run came to rest before {crash.event} happened "
            f"{crash.nth} time(s), so nothing was crashed"
            + ("" if model else f" (try --model {SCRIPTED_MODEL}: it always calls both tools)")
        )
    if run.state == "failed":
        sys.exit(1)


# -- migrate -----------------------------------------------------------------------


@cli.command()
@click.argument("src_url")
@click.argument("dst_url")
@click.option(
    "--skip-corrupt",
    is_flag=True,
    help="Skip runs whose stored data cannot be read (named at the end) instead of stopping.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def migrate(src_url: str, dst_url: str, skip_corrupt: bool, as_json: bool) -> None:
    """Copy every run (all revisions and events) from one store to another.

    Run again after it stopped, it goes on where it stopped: runs the destination
    holds whole are kept, a run it holds part of gets the revisions it lacks.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from statekernel.stores import migrate as migrate_store

    out = Output(as_json)
    check_existing_store(src_url)
    quiet = as_json or not out.errors.is_terminal
    columns = (TextColumn("migrating runs"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=out.errors, transient=True, disable=quiet) as progress:
        task = progress.add_task("migrating runs", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            result = run_async(
                migrate_store(src_url, dst_url, progress=report, skip_corrupt=skip_corrupt)
            )
        except ConflictError as exc:
            raise UserError(
                f"the destination holds another run with the id {exc.run_id!r} "
                "(a different history): migrate into another store"
            ) from exc
        except CorruptCheckpoint as exc:
            raise UserError(f"{exc}; pass --skip-corrupt to copy the other runs") from exc
    src, dst = redact_url(src_url), redact_url(dst_url)
    for damaged in result.skipped:
        said = f"skipped damaged run {damaged.run_id}: {damaged.problem}"
        out.errors.print(visible(said), markup=False)
    if as_json:
        skipped = [{"run_id": d.run_id, "problem": d.problem} for d in result.skipped]
        out.json(
            {
                "source": src,
                "destination": dst,
                "runs": result.copied,
                "kept": result.kept,
                "skipped": skipped,
            }
        )
    else:
        copied = result.copied
        line = f"migrated {copied} run{'' if copied == 1 else 's'} from {src} to {dst}"
        if result.kept:
            line += f" ({result.kept} already there)"
        if result.skipped:
            line += f"; skipped {len(result.skipped)} damaged"
        out.console.print(line)


# -- diagram -----------------------------------------------------------------------


@cli.command()
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("diagrams"),
    show_default=True,
)
@click.option(
    "--format",
    "formats",
    type=click.Choice(FORMATS),
    multiple=True,
    help="Formats to write (repeatable; default: all).",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the files are out of date.")
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def diagram(output_dir: Path, formats: tuple[str, ...], check: bool, as_json: bool) -> None:
    """Generate the lifecycle diagrams (Mermaid, DOT, SVG) from the lifecycle class."""
    out = Output(as_json)
    chosen = formats or FORMATS
    if check:
        stale = _stale(output_dir, [f for f in chosen if f != "svg"])
        if as_json:
            out.json({"stale": [str(p) for p in stale]})
        for path in stale:
            out.note(f"out of date: {path}")
        sys.exit(1 if stale else 0)
    skipped = [f for f in chosen if f == "svg" and not can_render_svg()]
    written = write_diagrams(output_dir, [f for f in chosen if f not in skipped])
    if as_json:
        out.json({"written": [str(p) for p in written], "skipped": skipped})
    else:
        for path in written:
            out.console.print(f"wrote {path}")
    for fmt in skipped:
        out.note(f"skipped {DIAGRAM_NAME}.{fmt}: graphviz's 'dot' is not installed")


def _stale(directory: Path, formats: Sequence[str]) -> list[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = write_diagrams(Path(tmp), formats)
        return [
            directory / p.name
            for p in fresh
            if not (directory / p.name).is_file()
            or not filecmp.cmp(p, directory / p.name, shallow=False)
        ]


# -- entry point -------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run the command line, exit with its status."""
    args = list(argv) if argv is not None else sys.argv[1:]
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        code = cli.main(args=args, prog_name="statekernel", standalone_mode=False)
    except click.ClickException as exc:  # a mistake: one line (JSON with --json), exit 2
        show_error(exc, as_json=as_json)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:  # Ctrl-C, or "no" to a confirmation
        if isinstance(exc.__context__, KeyboardInterrupt):
            click.echo("interrupted", err=True)
            sys.exit(130)
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if debug_enabled():
            raise
        click.echo(
            f"error: internal error: {type(exc).__name__}: {visible(one_line(str(exc)))} "
            "(set STATEKERNEL_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
