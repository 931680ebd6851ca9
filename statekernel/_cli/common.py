"""What every ``statekernel`` command shares: the store option, JSON output, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import attrs
import click
from rich.console import Console

from statekernel._records.convert import unstructure
from statekernel._records.run import PauseInfo
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import StatekernelError

__all__ = [
    "EXIT_USER_ERROR",
    "Output",
    "UserError",
    "check_existing_store",
    "command_hint",
    "common_options",
    "one_line",
    "open_cli_store",
    "run_async",
    "store_url",
]

EXIT_USER_ERROR = 2
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+@")


def one_line(message: str) -> str:
    """``message`` on one line, with any password inside a URL hidden."""
    text = " ".join(str(message).split())
    return _PASSWORD.sub(r"\g<head>***@", text)


class UserError(click.ClickException):
    """A mistake the user can fix: printed as one line on stderr, exit status 2."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: IO[Any] | None = None) -> None:
        """Print ``error: <message>`` on stderr."""
        click.echo(f"error: {self.message}", file=file or sys.stderr)


def run_async(coro: Awaitable[T]) -> T:
    """Run a coroutine; library errors become ``UserError`` (one line, exit 2)."""

    async def wrapped() -> T:
        return await coro

    try:
        return asyncio.run(wrapped())
    except StatekernelError as exc:
        raise UserError(str(exc) or type(exc).__name__) from exc


def store_url(explicit: str | None) -> str:
    """The ``--store`` URL, else the configured store (``STATEKERNEL_STORE``, config files,
    then the embedded SQLite default); an empty ``--store`` is a ``UserError``."""
    if explicit is not None:
        if not explicit.strip():
            raise UserError("--store is empty: give a store URL (or leave it out)")
        return explicit
    from statekernel._storage.config import default_store_url

    try:
        return default_store_url()
    except StatekernelError as exc:
        raise UserError(str(exc)) from exc


def check_existing_store(url: str) -> None:
    """Refuse a store URL that names no store yet (a missing or empty SQLite file, a
    SQLite file that is not a statekernel store, a missing file-store folder): commands
    that read never create one, nor write into another application's database."""
    from statekernel.stores import FileStore, SQLiteStore, open_store

    try:
        store = open_store(url)  # lazy: nothing is opened or created
    except StatekernelError as exc:
        raise UserError(str(exc)) from exc
    if isinstance(store, SQLiteStore) and store.path != ":memory:":
        path = Path(store.path)
        if not path.is_file():
            raise UserError(f"no SQLite store at {str(path)!r}: the file does not exist")
        if path.stat().st_size == 0:
            raise UserError(f"{str(path)!r} is empty: not a statekernel store")
        _check_store_file(str(path))
    elif isinstance(store, FileStore) and not store.root.is_dir():
        raise UserError(f"no file store at {str(store.root)!r}: the folder does not exist")


def _check_store_file(path: str) -> None:
    """A ``UserError`` for a SQLite file that is not a statekernel store (nothing written)."""
    from statekernel.stores._sqlite_schema import check_store_file

    try:
        check_store_file(path)
    except StatekernelError as exc:
        raise UserError(str(exc)) from exc


def command_hint(command: str, store: str | None, agent: str | None = None) -> str:
    """``command`` with the ``--store`` and ``--agent`` it needs to work as printed (a
    store URL holding a password shows as ``URL``)."""
    from statekernel.stores import redact_url

    hint = command
    if store:
        shown = redact_url(store)
        hint += " --store " + (shlex.quote(shown) if shown == store else "URL")
    if agent:
        hint += " --agent " + shlex.quote(agent)
    return hint


@contextlib.asynccontextmanager
async def open_cli_store(
    url: str | None, *, existing: bool = True
) -> AsyncIterator[CheckpointStore]:
    """Open the store named by ``--store`` (or the configured one), closed on exit.
    With ``existing`` (commands that act on stored runs) a store that does not exist
    yet is a ``UserError`` naming it, and nothing is created."""
    from statekernel.stores import open_store

    chosen = store_url(url)
    if existing:
        check_existing_store(chosen)
    store = open_store(chosen)
    try:
        yield store
    finally:
        await store.aclose()


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


def _fill(data: Any, value: Any) -> Any:
    """Put back the fields the stored encoding leaves out when they hold their default
    (and a pause's ``metadata``, the JSON view of its details)."""
    if attrs.has(type(value)) and isinstance(data, dict):
        for f in attrs.fields(type(value)):
            field_value = getattr(value, f.name)
            if f.name in data:
                data[f.name] = _fill(data[f.name], field_value)
            else:
                data[f.name] = _fill(unstructure(field_value), field_value)
        if isinstance(value, PauseInfo):  # what scripts read: the details as JSON
            data["metadata"] = value.metadata
    elif isinstance(value, list | tuple) and isinstance(data, list):
        return [_fill(d, v) for d, v in zip(data, value, strict=False)]
    return data


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return _fill(unstructure(value), value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


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
        data = _jsonable(value)
        text = json.dumps(data, ensure_ascii=False, indent=None if lines else 2, default=str)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def note(self, message: str) -> None:
        """A message for people (stderr when printing JSON, so stdout stays parseable)."""
        (self.errors if self.as_json else self.console).print(message)


def debug_enabled() -> bool:
    """True when ``STATEKERNEL_DEBUG`` asks for tracebacks of unexpected errors."""
    return os.environ.get("STATEKERNEL_DEBUG", "") not in ("", "0")
