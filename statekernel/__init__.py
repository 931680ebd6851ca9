"""statekernel: a durable run loop for LLM agents.

The run lifecycle is an explicit statechart; every transition is committed to a
checkpoint store before the next effect starts, so a run survives any crash and
resumes where it stopped without repeating a side effect that must not repeat.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from statekernel import errors
from statekernel._kernel.adapters import (
    tool_from_langchain,
    tool_from_pydantic_ai,
    tools_from_mcp_server,
)
from statekernel._kernel.asking import NeedsInput, ask_user, sleep_until
from statekernel._kernel.cancelling import CancelResult
from statekernel._kernel.delegate import child_run_id, delegate
from statekernel._kernel.dispatch import DispatchPolicy
from statekernel._kernel.hooks import Continue, Decision, Finish, Hooks, Pause, Rewrite, Skip
from statekernel._kernel.kernel import Kernel
from statekernel._kernel.output import output_as
from statekernel._kernel.retention import PruneResult
from statekernel._kernel.tools import Tool, ToolContext, ToolReturn, tool
from statekernel._lifecycle.chart import RunLifecycle
from statekernel._records.convert import to_plain
from statekernel._records.events import LIVE_EVENTS, PERSISTED_EVENTS, Event
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits
from statekernel._records.messages import (
    ContentPart,
    ImagePart,
    Message,
    ModelRequest,
    ModelResult,
    OutputSpec,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from statekernel._records.pauses import FAIL, PauseTimer
from statekernel._records.run import (
    STATE_IDS,
    Cancellation,
    FailureInfo,
    PauseInfo,
    Run,
    StateId,
    ToolCallRecord,
    Turn,
)
from statekernel._workers.worker import Worker, WorkerStats
from statekernel.errors import (
    ConflictError,
    CorruptCheckpoint,
    InvalidTransition,
    OutputInvalid,
    PauseTimedOut,
    ProviderError,
    RunBusy,
    RunCancelled,
    RunFailed,
    RunNotFound,
    StatekernelError,
    ToolError,
)

__all__ = [
    "CancelResult",
    "Cancellation",
    "ConflictError",
    "ContentPart",
    "Continue",
    "CorruptCheckpoint",
    "Decision",
    "DispatchPolicy",
    "Event",
    "FAIL",
    "FailureInfo",
    "Fallback",
    "Finish",
    "Hooks",
    "ImagePart",
    "InvalidTransition",
    "Kernel",
    "LIVE_EVENTS",
    "Limits",
    "Message",
    "ModelRequest",
    "ModelResult",
    "NeedsInput",
    "OutputInvalid",
    "OutputSpec",
    "PERSISTED_EVENTS",
    "Pause",
    "PauseInfo",
    "PauseTimedOut",
    "PauseTimer",
    "ProviderError",
    "PruneResult",
    "ReasoningPart",
    "Rewrite",
    "Run",
    "RunBusy",
    "RunCancelled",
    "RunFailed",
    "RunLifecycle",
    "RunNotFound",
    "STATE_IDS",
    "Skip",
    "StateId",
    "StatekernelError",
    "TextPart",
    "Tool",
    "ToolCall",
    "ToolCallRecord",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "ToolReturn",
    "ToolSpec",
    "Turn",
    "Usage",
    "Worker",
    "WorkerStats",
    "ask_user",
    "child_run_id",
    "delegate",
    "errors",
    "output_as",
    "sleep_until",
    "to_plain",
    "tool",
    "tool_from_langchain",
    "tool_from_pydantic_ai",
    "tools_from_mcp_server",
]

if TYPE_CHECKING:
    __version__: str
    """The installed version of statekernel (from the package's metadata)."""

_MOVED = {
    "MCPConnection": ("statekernel.mcp", "MCPConnection"),
    "Middleware": ("statekernel.middleware", "Middleware"),
    "ModelCall": ("statekernel.middleware", "ModelCall"),
    "ToolInvocation": ("statekernel.middleware", "ToolInvocation"),
    "ToolOutput": ("statekernel", "ToolReturn"),
    "mcp_http": ("statekernel.mcp", "mcp_http"),
    "mcp_stdio": ("statekernel.mcp", "mcp_stdio"),
    "set_tracer_provider": ("statekernel.telemetry", "set_tracer_provider"),
}
"""Names the top level used to export: where each lives now (see the changelog)."""

if not TYPE_CHECKING:  # type checkers report the old names as missing

    def __getattr__(name: str) -> Any:
        if name == "__version__":  # read when asked: importlib.metadata is slow to import
            from importlib.metadata import version as installed

            version = installed("statekernel")
            globals()["__version__"] = version
            return version
        moved = _MOVED.get(name)
        if moved is None:
            raise AttributeError(f"module 'statekernel' has no attribute {name!r}")
        module, new = moved
        warnings.warn(
            f"statekernel.{name} is deprecated; use {module}.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), new)
