"""Metrics of runs, through the OpenTelemetry metrics API (``opentelemetry-api``) only.

Instruments of the meter ``statekernel`` (``set_meter_provider`` picks its provider; the
global one otherwise, a no-op until an SDK is configured); without ``opentelemetry-api``
every helper is a no-op. The names and attributes are listed in one table in the
observability guide (``docs/guides/observability.md``):

``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``
    after the OpenTelemetry GenAI semantic conventions, per model call (``chat``) and per
    drive (``invoke_agent``, duration only).
``statekernel.commits``, ``statekernel.commit.duration``
    per commit, with ``statekernel.store`` (the store's kind) and
    ``statekernel.commit.outcome`` (``landed``, ``not_landed``, ``overtaken``).
``statekernel.takeovers``
    leases taken over from another owner (``Lease.taken_from``), and drives that found
    another drive's intents in flight without taking a lease over
    (``telemetry.record_takeover``).
``statekernel.uncertain_pauses``, ``statekernel.cancels``, ``statekernel.timers.fired``
    counted from what commits carry.
``statekernel.queue.depth``, ``statekernel.queue.wait``
    of the workers' run queues.
``statekernel.cost``
    the cost of model answers at the kernel's price table (``Kernel(prices=...)``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import metrics as _metrics
except ImportError:  # the otel extra is not installed: every helper is a no-op
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, MeterProvider, _Gauge

    from statekernel._storage.protocol import Checkpoint, CheckpointStore
    from statekernel._storage.queues import QueueEntry, RunQueue

__all__ = [
    "ENABLED",
    "Instruments",
    "delivered",
    "instruments",
    "record_commit",
    "sample_depth",
    "set_meter_provider",
    "store_kind",
]

_TOKEN_BUCKETS = [4.0**i for i in range(14)]  # 1 to 67,108,864 tokens (the conventions')
_SECONDS_BUCKETS = [0.01 * 2.0**i for i in range(14)]  # 10 ms to 81.92 s (the conventions')
_COMMIT_BUCKETS = [0.0005 * 2.0**i for i in range(16)]  # 0.5 ms to 16 s

_provider: MeterProvider | None = None
_instruments: Instruments | None = None


def set_meter_provider(provider: MeterProvider | None) -> None:
    """Send statekernel's metrics to ``provider`` (an OpenTelemetry ``MeterProvider``)
    rather than to OpenTelemetry's global one; None goes back to the global provider.

    Without this, metrics go to the provider set with ``opentelemetry.metrics.
    set_meter_provider``. Metrics need ``opentelemetry-api`` (``pip install
    'statekernel[otel]'``) and an SDK; without an SDK they are no-ops.
    """
    global _provider, _instruments
    _provider, _instruments = provider, None


def _histogram(meter: Any, name: str, **options: Any) -> Histogram:
    """``meter.create_histogram``; an API older than 1.30 takes no bucket advisory (its
    histograms get the SDK's default buckets)."""
    try:
        histogram: Histogram = meter.create_histogram(name, **options)
    except TypeError:
        options.pop("explicit_bucket_boundaries_advisory", None)
        histogram = meter.create_histogram(name, **options)
    return histogram


class Instruments:
    """statekernel's instruments, made once per meter provider."""

    def __init__(self) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            release: str | None = version("statekernel")
        except PackageNotFoundError:
            release = None
        meter = _metrics.get_meter("statekernel", release or "", meter_provider=_provider)
        self.token_usage: Histogram = _histogram(
            meter,
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.operation_duration: Histogram = _histogram(
            meter,
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.commits: Counter = meter.create_counter(
            "statekernel.commits", unit="{commit}", description="Commits of runs, by outcome."
        )
        self.commit_duration: Histogram = _histogram(
            meter,
            "statekernel.commit.duration",
            unit="s",
            description="Time to land a commit, store retries included.",
            explicit_bucket_boundaries_advisory=_COMMIT_BUCKETS,
        )
        self.takeovers: Counter = meter.create_counter(
            "statekernel.takeovers",
            unit="{takeover}",
            description=(
                "Leases taken over from another owner, and drives that took up a run with"
                " another drive's intents in flight."
            ),
        )
        self.uncertain_pauses: Counter = meter.create_counter(
            "statekernel.uncertain_pauses",
            unit="{pause}",
            description="Runs paused because a tool call may or may not have run.",
        )
        self.cancels: Counter = meter.create_counter(
            "statekernel.cancels", unit="{run}", description="Runs cancelled."
        )
        self.timers_fired: Counter = meter.create_counter(
            "statekernel.timers.fired", unit="{timer}", description="Pause timers fired."
        )
        self.queue_depth: _Gauge = meter.create_gauge(
            "statekernel.queue.depth",
            unit="{entry}",
            description="Entries of a run queue not delivered yet.",
        )
        self.queue_wait: Histogram = _histogram(
            meter,
            "statekernel.queue.wait",
            unit="s",
            description="Time from an entry's submission to its delivery to a worker.",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.cost: Counter = meter.create_counter(
            "statekernel.cost",
            unit="{currency}",
            description="Cost of model answers at the kernel's price table.",
        )


def instruments() -> Instruments | None:
    """The instruments (None without ``opentelemetry-api``)."""
    global _instruments
    if not ENABLED:
        return None
    if _instruments is None:
        _instruments = Instruments()
    return _instruments


def store_kind(store: CheckpointStore) -> str:
    """The kind of a store, for ``statekernel.store``: ``sqlite``, ``redis``,
    ``postgres``, ``file``, ``memory`` for the built-in ones (and their subclasses), else
    the class's name."""
    return _kind(type(store))


@functools.cache
def _kind(store: type) -> str:
    for cls in store.__mro__:
        if cls.__module__.startswith("statekernel.stores.") and cls.__name__.endswith("Store"):
            return cls.__name__.removesuffix("Store").lower()
    return store.__name__


_UNCERTAIN = "uncertain_tool_calls"


def record_commit(checkpoint: Checkpoint, store: str, outcome: str, seconds: float) -> None:
    """Count a commit and its duration; for one that landed, what its events tell:
    an uncertain pause, a cancellation, a fired timer."""
    made = instruments()
    if made is None:
        return
    attributes: Mapping[str, Any] = {
        "statekernel.store": store,
        "statekernel.commit.outcome": outcome,
    }
    made.commits.add(1, attributes)
    made.commit_duration.record(seconds, attributes)
    if outcome != "landed":
        return
    for event in checkpoint.events:
        kind = event.type
        if kind == "run_paused" and _reason(event.data) == _UNCERTAIN:
            made.uncertain_pauses.add(1)
        elif kind == "run_cancelled":
            made.cancels.add(1)
        elif kind == "timer_fired":
            made.timers_fired.add(1)


def delivered(queue: str, entry: QueueEntry) -> None:
    """An entry first delivered to a worker: how long it waited since its submission."""
    made = instruments()
    if made is None or entry.deliveries != 1 or entry.submitted_ms <= 0:
        return
    waited = max(0.0, time.time() - entry.submitted_ms / 1000)
    made.queue_wait.record(waited, {"statekernel.queue.name": queue})


def _configured() -> bool:
    """Whether metrics go to a meter provider that records (not the API's no-op, nor its
    placeholder before any provider is set)."""
    if not ENABLED:
        return False
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    provider = _provider if _provider is not None else _metrics.get_meter_provider()
    return not isinstance(provider, _metrics.NoOpMeterProvider | _ProxyMeterProvider)


async def sample_depth(queue: RunQueue) -> None:
    """Record how many entries of ``queue`` wait for delivery: one read of the store,
    made only when a meter provider that records is configured."""
    made = instruments()
    if made is not None and _configured():
        depth = await queue.waiting()
        made.queue_depth.set(depth, {"statekernel.queue.name": queue.name})


def _reason(data: object) -> object:
    return data.get("reason") if isinstance(data, Mapping) else None
