"""What every ``statekernel`` command shares: the store option, JSON output, errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import attrs
import click
from rich.console import Console

from statekernel import Kernel, to_plain
from statekernel._front.reach import redact
from statekernel._front.visible import json_text, visible
from statekernel.stores import CheckpointStore

__all__ = [
    "EXIT_USER_ERROR",
    "Output",
    "UserError",
    "check_existing_store",
    "command_hint",
    "common_options",
    "one_line",
    "open_cli_kernel",
    "open_cli_store",
    "run_async",
    "run_hint",
    "show_error",
    "store_url",
    "warnings_shown",
]

EXIT_USER_ERROR = 2
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def one_line(message: str) -> str:
    """``message`` on one line, with any secret in it hidden (``redact``)."""
    return redact(" ".join(str(message).split()))


class UserError(click.ClickException):
    """A mistake the user can fix: printed as one line on stderr (then ``hint``, the
    commands that help, on lines of their own), exit status 2."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(one_line(message))
        self.hint = redact(hint)

    def show(self, file: IO[Any] | None = None) -> None:
        """Print ``error: <message>`` (and the hint) on stderr."""
        click.echo(f"error: {visible(self.message)}", file=file or sys.stderr)
        if self.hint:
            click.echo(self.hint, file=file or sys.stderr)


def show_error(exc: click.ClickException, *, as_json: bool) -> None:
    """Print a command's error on stderr: as ``exc.show()`` does, or with ``--json`` as
    one JSON object ``{"error": message, "exit_code": n}`` (and ``"hint"``)."""
    if not as_json:
        exc.show()
        return
    shown: dict[str, Any] = {"error": exc.format_message(), "exit_code": exc.exit_code}
    hint = getattr(exc, "hint", "")
    if hint:
        shown["hint"] = hint
    sys.stderr.write(json_text(shown) + "\n")
    sys.stderr.flush()


def run_async(coro: Awaitable[T]) -> T:
    """Run a coroutine to its end (library errors reach the command line's one error
    boundary, which prints them as one line and exits 2)."""

    async def wrapped() -> T:
        return await coro

    return asyncio.run(wrapped())


def store_url(explicit: str | None) -> str:
    """The ``--store`` URL, else the configured store (``STATEKERNEL_STORE``, config files,
    then the embedded SQLite default); an empty ``--store`` is a ``UserError``."""
    if explicit is not None:
        if not explicit.strip():
            raise UserError("--store is empty: give a store URL (or leave it out)")
        return explicit
    from statekernel._front.reach import default_store_url

    return default_store_url()


def check_existing_store(url: str) -> None:
    """Refuse a store URL that names no store yet (a missing or empty SQLite file, a
    SQLite file that is not a statekernel store, a missing file-store folder): commands
    that read never create one, nor write into another application's database."""
    from statekernel._front.reach import check_store_file
    from statekernel.stores import FileStore, SQLiteStore, open_store

    store = open_store(url)  # lazy: nothing is opened or created
    if isinstance(store, SQLiteStore) and store.path != ":memory:":
        path = Path(store.path)
        if not path.is_file():
            raise UserError(f"no SQLite store at {str(path)!r}: the file does not exist")
        if path.stat().st_size == 0:
            raise UserError(f"{str(path)!r} is empty: not a statekernel store")
        check_store_file(str(path))
    elif isinstance(store, FileStore) and not store.root.is_dir():
        raise UserError(f"no file store at {str(store.root)!r}: the folder does not exist")


def command_hint(
    command: str, store: str | None, agent: str | None = None, *, queue: str | None = None
) -> str:
    """``command`` with the ``--store``, ``--agent`` and ``--queue`` it needs to work as
    printed, each shell-quoted (a store URL holding a password shows as ``URL``)."""
    from statekernel.stores import redact_url

    hint = command
    if store:
        shown = redact_url(store)
        hint += " --store " + (shlex.quote(shown) if shown == store else "URL")
    if agent:
        hint += " --agent " + shlex.quote(agent)
    if queue:
        hint += " --queue " + shlex.quote(queue)
    return hint


def run_hint(
    action: str, run_id: str, store: str | None, agent: str | None = None, *more: str
) -> str:
    """The command ``statekernel runs ACTION RUN_ID [MORE...]`` with the ``--store`` and
    ``--agent`` it was given, every part shell-quoted so that it runs as printed."""
    words = ["statekernel", "runs", action, run_id, *more]
    return command_hint(" ".join(shlex.quote(w) for w in words), store, agent)


class _ShownWarnings(logging.Handler):
    """Prints the library's warnings (a wait for a run another owner holds, a commit
    tried again, a lease lost) on stderr, one line each, escapes shown escaped."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(visible(one_line(record.getMessage())), file=sys.stderr)
        except Exception:  # a logging handler never raises into the code that logs
            self.handleError(record)


@contextlib.contextmanager
def warnings_shown() -> Iterator[None]:
    """While a command drives or changes runs, the ``statekernel`` logger's warnings
    reach stderr, whatever logging the application (``--agent``) set up: a wait for a
    run another owner holds (who holds it, and for how long at most) is never silent.
    They go to stderr only (not also to the application's handlers) meanwhile."""
    log = logging.getLogger("statekernel")
    handler = _ShownWarnings(logging.WARNING)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.WARNING:
        log.setLevel(logging.WARNING)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


@contextlib.asynccontextmanager
async def open_cli_store(
    url: str | None, *, existing: bool = True, reading: bool = False
) -> AsyncIterator[CheckpointStore]:
    """Open the store named by ``--store`` (or the configured one), closed on exit.
    With ``existing`` (commands that act on stored runs) a store that does not exist
    yet is a ``UserError`` naming it, and nothing is created. With ``reading``
    (commands that only read) a PostgreSQL store opens read-only: nothing is created or
    upgraded there either."""
    from statekernel._front.reach import open_store_to_read
    from statekernel.stores import open_store

    chosen = store_url(url)
    if existing:
        check_existing_store(chosen)
    store = open_store_to_read(chosen) if reading else open_store(chosen)
    try:
        yield store
    finally:
        await store.aclose()


@contextlib.asynccontextmanager
async def open_cli_kernel(
    url: str | None, *, existing: bool = True, reading: bool = False, **options: Any
) -> AsyncIterator[Kernel]:
    """A kernel (with ``options``) on the store ``open_cli_store`` opens; both are closed
    on exit."""
    async with (
        open_cli_store(url, existing=existing, reading=reading) as store,
        Kernel(store, **options) as kernel,
    ):
        yield kernel


def common_options(fn: F) -> F:
    """Add ``--store URL`` and ``--json`` to a command."""
    fn = click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print machine-readable JSON instead of tables.",
    )(fn)
    fn = click.option(
        "--store",
        "store",
        metavar="URL",
        default=None,
        help="Checkpoint store URL (default: STATEKERNEL_STORE, config, "
        "then sqlite:///.statekernel/runs.db).",
    )(fn)
    return fn


def _console(*, stderr: bool = False) -> Console:
    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console = Console(highlight=False, stderr=stderr, width=max(console.width, 160))
    return console


@attrs.define
class Output:
    """Where a command writes: rich for people, JSON for scripts."""

    as_json: bool = False
    console: Console = attrs.field(factory=_console)
    errors: Console = attrs.field(factory=lambda: _console(stderr=True))

    def json(self, value: Any, *, lines: bool = False) -> None:
        """Print ``value`` (records are unstructured) as JSON; one line when ``lines``."""
        data = to_plain(value)
        text = json_text(data, indent=None if lines else 2, default=str)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def note(self, message: str, *, markup: bool = True) -> None:
        """A message for people (stderr when printing JSON, so stdout stays parseable);
        ``markup=False`` for text holding a run's data (printed as it is)."""
        console = self.errors if self.as_json else self.console
        console.print(message, markup=markup, emoji=markup)


def debug_enabled() -> bool:
    """True when ``STATEKERNEL_DEBUG`` asks for tracebacks of unexpected errors."""
    return os.environ.get("STATEKERNEL_DEBUG", "") not in ("", "0")
