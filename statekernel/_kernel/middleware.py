"""Middleware: ``async def mw(call, next)`` chains around model calls and tool calls.

The first middleware in the list is the outermost. A middleware may change the
call (``attrs.evolve``), retry ``next``, or return without calling it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import attrs

from statekernel._records.messages import JSON, ModelRequest
from statekernel._records.run import Run, ToolCallRecord

__all__ = ["Middleware", "ModelCall", "ToolInvocation", "chain"]


@attrs.frozen
class ModelCall:
    """A model call passing through middleware; ``next`` returns a ``ModelResult``."""

    run: Run
    request: ModelRequest


@attrs.frozen
class ToolInvocation:
    """A tool call passing through middleware; ``next`` returns the tool's JSON output.

    Raise (for instance ``ToolError``) to make it an error result.
    """

    run: Run
    call: ToolCallRecord
    input: JSON
    idempotent: bool


Call: TypeAlias = ModelCall | ToolInvocation
Next: TypeAlias = Callable[[Any], Awaitable[Any]]
Middleware: TypeAlias = Callable[[Any, Next], Awaitable[Any]]


def chain(middleware: Sequence[Middleware], terminal: Next) -> Next:
    """``terminal`` wrapped by ``middleware``, the first one outermost."""
    handler = terminal
    for mw in reversed(middleware):
        handler = _bind(mw, handler)
    return handler


def _bind(mw: Middleware, nxt: Next) -> Next:
    async def handler(call: Any) -> Any:
        return await mw(call, nxt)

    return handler
