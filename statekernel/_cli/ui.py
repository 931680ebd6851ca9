"""``statekernel ui``: serve the web view of a store's runs (needs the ``ui`` extra)."""

from __future__ import annotations

import importlib
import importlib.util
import ipaddress
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from statekernel._cli.common import UserError, check_existing_store, store_url
from statekernel._front.agents import load_agent, load_named
from statekernel.stores import redact_url

if TYPE_CHECKING:
    from statekernel.web.context import Authorize

__all__ = ["ui"]

CONCURRENCY = 100
"""Connections (each page streams on one) the view serves at once by default."""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _unspecified(host: str) -> bool:
    """Whether ``host`` is ``0.0.0.0`` or ``::`` (every address of the machine)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _allowed_hosts(host: str, given: Sequence[str]) -> list[str]:
    """The names the view answers: loopback's, the address it listens on (unless it
    is every address), and ``--allowed-host``'s."""
    from statekernel.errors import ConfigError
    from statekernel.web.hosts import LOOPBACK_HOSTS, allowed_names

    names = [*LOOPBACK_HOSTS, *([] if _unspecified(host) else [host]), *given]
    try:
        allowed_names(given or LOOPBACK_HOSTS)  # each as the user wrote it
    except ConfigError as exc:
        raise UserError(str(exc).replace("allowed_hosts", "--allowed-host", 1)) from None
    return list(dict.fromkeys(names))


def _load_authorize(spec: str) -> Authorize:
    """The ``authorize`` hook named by ``package.module:function`` (the module looked
    for in the current directory too, as ``--agent``'s)."""
    target = load_named("--authorize", spec)
    if not callable(target):
        raise UserError(f"--authorize {spec!r} is a {type(target).__name__}, not a function")
    hook: Authorize = target
    return hook


def _refuse_acting_for_anyone(host: str) -> None:
    raise UserError(
        f"--host {host} is not a loopback address: with --agent anyone who reaches the "
        "view could act on runs (answer, send, retry, fork, delete). Give --authorize "
        "package.module:function to decide who may, or pass --allow-anyone-to-act to "
        "let anyone who reaches it act"
    )


def _exposure(host: str, acting: bool, authorize: str | None, open_to_all: bool) -> str:
    """What the start-up line adds about who can reach the view off loopback."""
    if _loopback(host):
        return ""
    if authorize is not None:
        said = f"\nlistening on {host}, not on loopback: --authorize {authorize} decides "
        return said + "each page and action"
    return (
        f"\nwarning: listening on {host}, not on loopback: anyone who reaches it can read "
        "runs"
        + (" and act on them (--allow-anyone-to-act)" if acting and open_to_all else "")
        + "; give --authorize or put it behind your own authentication"
    )


@click.command()
@click.option(
    "--store",
    metavar="URL",
    default=None,
    help="Checkpoint store URL (default: STATEKERNEL_STORE, config, "
    "then sqlite:///.statekernel/runs.db).",
)
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="Kernel arguments (tools, hooks, providers) to act on runs with; "
    "without it the view is read-only.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (loopback by default; off loopback, --agent needs "
    "--authorize or --allow-anyone-to-act).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    metavar="NAME",
    multiple=True,
    help="A name (or address) browsers reach the view by, answered besides localhost, "
    "127.0.0.1, [::1] and the --host address (repeatable); a request addressed to "
    "another name gets 400.",
)
@click.option(
    "--authorize",
    metavar="MODULE:FUNCTION",
    help="authorize(request, action, run_id) -> bool, asked about each page and action "
    "(needed with --agent off loopback, or --allow-anyone-to-act).",
)
@click.option(
    "--allow-anyone-to-act",
    is_flag=True,
    help="Off loopback with --agent and no --authorize: let anyone who reaches the view "
    "act on runs (answer, send, retry, fork, delete).",
)
@click.option(
    "--limit-concurrency",
    type=click.IntRange(1),
    default=CONCURRENCY,
    show_default=True,
    help="Connections served at once (a live page holds one); more are answered 503.",
)
def ui(
    store: str | None,
    agent: str | None,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    authorize: str | None,
    allow_anyone_to_act: bool,
    limit_concurrency: int,
) -> None:
    """Serve the web view: runs, their transcripts, events (live), diagrams, and, with
    --agent, the actions (answer, resolve, send, retry, fork, delete).

    It answers requests addressed to loopback's names (and --allowed-host's) only. Off
    loopback with --agent it starts only with --authorize or --allow-anyone-to-act."""
    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise UserError("the web view needs its extra: pip install 'statekernel[ui]'")
    import uvicorn

    from statekernel.web import create_app

    if agent and not _loopback(host) and authorize is None and not allow_anyone_to_act:
        _refuse_acting_for_anyone(host)
    names = _allowed_hosts(host, allowed_hosts)
    hook = _load_authorize(authorize) if authorize else None
    url = store_url(store)
    check_existing_store(url)
    options = load_agent(agent) if agent else None
    app = create_app(url, agent=options, authorize=hook, allowed_hosts=names)
    where = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
    said = f"statekernel ui: {redact_url(url)} on {where}"
    said += "" if options is not None else " (read-only: no --agent)"
    said += _exposure(host, options is not None, authorize, allow_anyone_to_act)
    if not _loopback(host) or allowed_hosts:
        said += f"\nanswering requests addressed to: {', '.join(names)}"
    if _unspecified(host) and not allowed_hosts:
        said += (
            "\nnote: a browser on another machine reaches it by a name or address of this "
            "one, refused (400) until given with --allowed-host"
        )
    click.echo(said, err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", limit_concurrency=limit_concurrency)
