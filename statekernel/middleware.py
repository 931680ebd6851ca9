"""Middleware around model calls and tool calls.

A middleware is ``async def mw(call, next)``: ``call`` is a :class:`ModelCall` or a
:class:`ToolInvocation`, and ``await next(call)`` goes on inward (the first middleware
in ``Kernel(middleware=[...])`` is the outermost). It may change the call with
``attrs.evolve``, retry ``next``, or return without calling it.
"""

from __future__ import annotations

from statekernel._kernel.middleware import Middleware, ModelCall, ToolInvocation

__all__ = ["Middleware", "ModelCall", "ToolInvocation"]
