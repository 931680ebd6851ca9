"""``statekernel worker``: drive the runs of a store's run queue until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

import attrs
import click

from statekernel import Worker, WorkerStats
from statekernel._cli.common import UserError, run_async, store_url
from statekernel._front.agents import load_agent
from statekernel._front.reach import queue_schemes
from statekernel.stores import RunQueues, open_store, redact_url

__all__ = ["worker"]


def _has_run_queues(url: str) -> bool:
    """Whether the store ``url`` names declares run queues (``RunQueues``); opening is
    lazy, so nothing is connected to find out."""
    opened = open_store(url)
    try:
        return isinstance(opened, RunQueues)
    finally:
        run_async(opened.aclose())


async def _said_where(worker: Worker) -> None:
    """Print where the health endpoint listens, once it does."""
    await worker.health_listening.wait()
    click.echo(f"health endpoint: http://{worker.health_host}:{worker.health_port}", err=True)


async def _serve(worker: Worker, health: bool = False) -> WorkerStats:
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        worker.stop(now=signals > 1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    said = asyncio.create_task(_said_where(worker)) if health else None
    try:
        return await worker.serve()
    finally:
        if said is not None:
            said.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@click.command()
@click.option(
    "--store",
    metavar="URL",
    help=f"Store URL with run queues: {queue_schemes()} (default: the configured store).",
)
@click.option("--queue", default="default", show_default=True, help="Queue to consume.")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Runs in hand at most.",
)
@click.option(
    "--agent",
    metavar="MODULE:FUNCTION",
    help="A function returning the Kernel keyword arguments the runs need "
    "(tools, providers, hooks, middleware, dispatch, max_turns).",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds a run's lease lives unrenewed (a crashed worker's runs wait this long).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds SIGTERM lets runs reach a clean stopping point.",
)
@click.option("--name", help="Consumer name (default: host-pid-random).")
@click.option(
    "--timers",
    is_flag=True,
    help="Also fire the pause timers and deadlines of the store's paused runs "
    "(questions and approvals that time out, durable sleeps).",
)
@click.option(
    "--timer-every",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Seconds between two looks for due timers (with --timers).",
)
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /livez, /readyz and /queue (JSON) over HTTP on this port (0: a free one, "
    "printed); needs statekernel[ui].",
)
@click.option(
    "--health-host",
    default="127.0.0.1",
    show_default=True,
    help="Address of the health endpoint (loopback unless told otherwise).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the final counts as JSON.")
def worker(
    store: str | None,
    queue: str,
    concurrency: int,
    agent: str | None,
    lease_ttl: float,
    grace: float,
    name: str | None,
    timers: bool,
    timer_every: float,
    health_port: int | None,
    health_host: str,
    as_json: bool,
) -> None:
    """Drive the runs submitted to a run queue (kernel.submit), many at once.

    Runs as many workers as you like, on as many machines. SIGTERM (or Ctrl-C) stops
    taking work, lets each run reach a clean stopping point and hands it back to the
    queue; a second signal stops at once. Runs of a worker that died are taken over by
    the others after --lease-ttl seconds.
    """
    url = store_url(store)
    if not _has_run_queues(url):
        shown = redact_url(url)
        raise UserError(
            f"a worker needs a store with run queues ({queue_schemes()}), not {shown!r}"
        )
    options = load_agent(agent)
    runner = Worker(
        url,
        queue=queue,
        concurrency=concurrency,
        agent=options,
        lease_ttl=lease_ttl,
        grace=grace,
        name=name,
        timers=timers,
        timer_every=timer_every,
        health_port=health_port,
        health_host=health_host,
    )
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    click.echo(f"worker {runner.name}: queue {queue!r} on {redact_url(url)}", err=True)
    stats = run_async(_serve(runner, health_port is not None))
    if as_json:
        click.echo(json.dumps({"worker": runner.name, "queue": queue, **attrs.asdict(stats)}))
    click.echo(
        f"worker {runner.name} stopped: {stats.completed} completed, {stats.paused} paused, "
        f"{stats.failed} failed, {stats.requeued} handed back, {stats.reclaimed} reclaimed"
        + (f", {stats.timers_fired} timers fired" if timers else ""),
        err=True,
    )
    sys.stdout.flush()
