"""What the parts of a drive share: the agent a drive reads (``Agent``), what the model
call and the tool calls read from their driver (``Driving``), and the hooks they call.

A drive is split in three modules that import downward only: ``drive`` (the driver:
stage, commit, and the loop from effect to effect) uses ``model_call`` (calling the
model), which uses ``tool_calls`` (running tools, and starting them early while an
answer streams); all three use this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from statekernel._kernel import hooks as hk
from statekernel._records.run import PauseInfo, Run, Turn
from statekernel.errors import InvalidTransition

if TYPE_CHECKING:
    from statekernel._kernel.commit import Committer
    from statekernel._kernel.dispatch import DispatchPolicy
    from statekernel._kernel.middleware import Middleware
    from statekernel._kernel.pending import PendingCommit
    from statekernel._kernel.telemetry import TraceContext
    from statekernel._kernel.tools import Tool
    from statekernel._records.events import Event
    from statekernel._records.messages import ToolSpec
    from statekernel._records.prices import Prices
    from statekernel._storage.protocol import CheckpointStore, Lease
    from statekernel._storage.provider import ModelProvider

__all__ = ["Agent", "Driving", "HookFailed", "Models", "hook", "turn_decision", "turn_of"]


class Models(Protocol):
    """Resolves a ``provider/model`` string to its provider (``ProviderRegistry``)."""

    def get(self, model: str) -> ModelProvider:
        """The provider of ``model``."""
        ...


class Agent(Protocol):
    """What a drive reads from its kernel (``Kernel`` is one): the store it commits to,
    the agent's tools, hooks, middleware and dispatch policy, and its models."""

    @property
    def store(self) -> CheckpointStore:
        """Where the run's commits land."""
        ...

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's tools by name."""
        ...

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told about the tools."""
        ...

    @property
    def hooks(self) -> object:
        """The ``Hooks`` (any object with some of its methods)."""
        ...

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """Around every model and tool call, outermost first."""
        ...

    @property
    def dispatch(self) -> DispatchPolicy:
        """How tool calls are started."""
        ...

    @property
    def registry(self) -> Models:
        """The model providers."""
        ...

    @property
    def lease_margin(self) -> float:
        """Seconds the run's lease must surely last when a model or tool call starts."""
        ...

    @property
    def prices(self) -> Prices:
        """What the models' tokens cost (``"provider/name"`` to a ``Price``)."""
        ...


class Driving(Protocol):
    """What the model call and the tool calls read from their driver (``RunDriver``)."""

    @property
    def kernel(self) -> Agent:
        """The agent the run is driven by."""
        ...

    @property
    def run(self) -> Run:
        """The driver's copy of the run: the last commit and what was staged since."""
        ...

    @property
    def pending(self) -> PendingCommit:
        """The commit being gathered."""
        ...

    @property
    def observing(self) -> bool:
        """Whether the hooks observe committed results (``on_tool_call_completed``)."""
        ...

    @property
    def queue(self) -> asyncio.Queue[Event | None]:
        """Live events for the drive to yield (None: wake up and look again)."""
        ...

    @property
    def lease(self) -> Lease | None:
        """The run's lease (None: unfenced)."""
        ...

    @property
    def trace_parent(self) -> TraceContext | None:
        """The span the spans of model and tool calls are parented under."""
        ...

    def stage(self, event: str, **payload: Any) -> None:
        """Apply one transition; it joins the commit being gathered."""
        ...

    async def commit(self) -> tuple[Event, ...]:
        """Commit what was staged; the events that landed."""
        ...

    async def ensure_lease(self) -> None:
        """Return once the lease surely lasts long enough for an effect to start."""
        ...

    @property
    def committer(self) -> Committer:
        """Commits the driver's changes (``check_cancel``: a cancel request it knows of)."""
        ...


class HookFailed(Exception):
    """A hook raised ``original``: the run fails (in the next commit)."""

    def __init__(self, original: BaseException) -> None:
        self.original = original


async def hook(kernel: Agent, name: str, *args: Any) -> Any:
    """Call the hook ``name``; what it raises comes out as ``HookFailed``."""
    try:
        return await hk.call_hook(kernel.hooks, name, *args)
    except Exception as exc:
        raise HookFailed(exc) from exc


async def turn_decision(
    kernel: Agent, run: Run, turn: Turn, default: str
) -> tuple[str | None, PauseInfo | None]:
    """What ``on_turn_completed`` decides about ``turn`` as (finish reason, pause to
    take after it); ``default`` is the finish reason when the hook says nothing."""
    decision = await hook(kernel, "on_turn_completed", run, turn)
    if decision is None:
        return default, None
    if isinstance(decision, hk.Continue):
        return None, None
    if isinstance(decision, hk.Finish):
        return decision.reason, None
    if isinstance(decision, hk.Pause):
        return None, PauseInfo(decision.reason, "preparing_turn", decision.details)
    raise HookFailed(TypeError(f"on_turn_completed cannot return {decision!r}"))


def turn_of(run: Run) -> Turn:
    """The turn in progress (``InvalidTransition`` when there is none)."""
    if run.current_turn is None:
        raise InvalidTransition("advance", run.state, "no turn in progress")
    return run.current_turn
