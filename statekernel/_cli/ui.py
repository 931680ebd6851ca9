"""``statekernel ui``: serve the web view of a store's runs (needs the ``ui`` extra)."""

from __future__ import annotations

import importlib.util
import ipaddress
from typing import Any

import click

from statekernel._cli.common import UserError, check_existing_store, store_url
from statekernel._cli.worker import load_agent
from statekernel.stores import redact_url

__all__ = ["ui"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    help="Address to listen on (loopback by default: anyone who reaches the view can act on runs).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
def ui(store: str | None, agent: str | None, host: str, port: int) -> None:
    """Serve the web view: runs, their transcripts, events (live), diagrams, and, with
    --agent, the actions (answer, resolve, send, retry, fork, delete)."""
    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise UserError("the web view needs its extra: pip install 'statekernel[ui]'")
    import uvicorn

    from statekernel.web import create_app

    url = store_url(store)
    check_existing_store(url)
    options = load_agent(agent) if agent else None
    app = create_app(url, agent=options)
    where = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
    said = f"statekernel ui: {redact_url(url)} on {where}"
    said += "" if options is not None else " (read-only: no --agent)"
    if not _loopback(host):
        said += (
            f"\nwarning: listening on {host}, not on loopback: anyone who reaches it can "
            "read runs"
            + (" and act on them" if options is not None else "")
            + "; put it behind your own authentication"
        )
    click.echo(said, err=True)
    served: Any = app
    if _loopback(host):  # a page of another site resolving its name to 127.0.0.1 is refused
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        names = ["localhost", "127.0.0.1", "[::1]", "::1", host]
        served = TrustedHostMiddleware(app, allowed_hosts=names)
    uvicorn.run(served, host=host, port=port, log_level="warning")
