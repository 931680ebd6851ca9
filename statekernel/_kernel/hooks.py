"""Hooks: the product's say at each point of a turn, and the decisions they return.

Every hook is optional and may be sync or async. A hook that raises moves the run
to ``failed`` with the state it failed in; ``retry`` calls it again, except
``on_tool_call_completed``, which runs after its result's commit (see there).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Awaitable
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

import attrs

from statekernel._records.checks import checked_request, checked_result, kind_problem
from statekernel._records.messages import JSON, ModelRequest, ModelResult
from statekernel._records.pauses import HookPause, PauseTimer, make_timer
from statekernel._records.run import Run, ToolCallRecord, Turn
from statekernel._records.values import checked, json_problem
from statekernel.errors import ConfigError, InvalidArgument

__all__ = [
    "Continue",
    "Decision",
    "Finish",
    "Hooks",
    "MaybeAwaitable",
    "Pause",
    "Rewrite",
    "Skip",
    "HOOK_NAMES",
    "call_hook",
    "check_hooks",
    "checked_answer",
]


def _rewrite_input(value: JSON) -> JSON:
    return checked(value, "Rewrite.input")


def _skip_result(value: JSON) -> JSON:
    return checked(value, "Skip.result")


def _pause_metadata(value: JSON) -> JSON:
    return checked(value, "Pause.metadata")


def _text(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A field that is a ``str`` (``InvalidArgument`` naming it and the value)."""
    where = f"{type(instance).__name__}.{attribute.name}"
    problem = kind_problem(value, (str,), where)
    if problem is not None:
        raise InvalidArgument(problem)


def _optional_text(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _text(instance, attribute, value)


def _skip_error(instance: Skip, attribute: attrs.Attribute[Any], value: Any) -> None:
    """``Skip.error``: None or a ``str``, and not beside a ``result``."""
    _optional_text(instance, attribute, value)
    if value is not None and instance.result is not None:
        raise InvalidArgument(
            "Skip takes result= or error=, not both (the call's outcome is one of them)"
        )


@attrs.frozen
class Continue:
    """Go on as the kernel would anyway (after a turn: take another turn)."""


@attrs.frozen
class Rewrite:
    """Run the tool call with this input instead of the model's arguments."""

    input: JSON = attrs.field(converter=_rewrite_input)


@attrs.frozen
class Skip:
    """Do not run the tool; record ``result`` (or ``error``) as its outcome."""

    result: JSON = attrs.field(default=None, converter=_skip_result)
    error: str | None = attrs.field(default=None, validator=_skip_error)


@attrs.frozen
class Pause:
    """Pause the run here (for approval, budget, ...); ``resume`` comes back to this point.

    ``timeout`` (seconds from now) or ``until`` (an aware datetime): the pause ends by
    itself then, with nobody watching (a worker's timer loop, or whoever touches the run
    next): the run resumes with ``on_timeout`` as its resume value, or fails with
    ``PauseTimedOut`` for ``on_timeout=FAIL``. ``Pause("sleep", until=when)`` is a durable
    sleep.
    """

    reason: str = attrs.field(validator=_text)
    metadata: JSON = attrs.field(factory=dict, converter=_pause_metadata)
    timeout: float | None = attrs.field(default=None, kw_only=True)
    until: datetime | None = attrs.field(default=None, kw_only=True)
    on_timeout: JSON = attrs.field(default=None, kw_only=True)
    timer: PauseTimer | None = attrs.field(init=False)
    """When the pause ends by itself (from ``timeout`` or ``until``, and ``on_timeout``)."""

    @timer.default
    def _timer(self) -> PauseTimer | None:
        return make_timer(self.timeout, self.until, self.on_timeout, what="Pause")

    @property
    def details(self) -> HookPause:
        """The pause's details as the run keeps them."""
        return HookPause(self.metadata, self.timer)


@attrs.frozen
class Finish:
    """Complete the run (tool calls that did not run get a 'not run' error result)."""

    reason: str = attrs.field(default="finished", validator=_text)


Decision: TypeAlias = Continue | Rewrite | Skip | Pause | Finish

T = TypeVar("T")
MaybeAwaitable: TypeAlias = T | Awaitable[T]
"""A hook's answer, or an awaitable of it: every hook may be ``async def``."""


class Hooks:
    """Base class with the default behaviour; override what you need.

    Any object with some of these methods works as ``Kernel(hooks=...)`` too. Any
    other ``on_*`` method on it (a misspelt hook) is a ``ConfigError`` at ``Kernel``.
    Every hook may be a coroutine function (``async def``) as well.
    """

    def on_turn_prepared(
        self, run: Run, request: ModelRequest
    ) -> MaybeAwaitable[ModelRequest | None]:
        """Return the exact request to send (None keeps the default: the whole transcript).

        Returns:
            The ``ModelRequest`` to send, or None for ``request`` as it is. A request a
                run cannot store (``InvalidArgument``) fails the run, as a hook that raises
                does.
        """
        return None

    def on_model_completed(
        self, run: Run, result: ModelResult
    ) -> MaybeAwaitable[ModelResult | None]:
        """Inspect or replace the model's result before it enters the run.

        Returns:
            The ``ModelResult`` to record instead, or None to keep ``result``. A result
                a run cannot store (``InvalidArgument``) fails the run, as a hook that
                raises does.
        """
        return None

    def on_tool_call_started(
        self, run: Run, call: ToolCallRecord
    ) -> MaybeAwaitable[Decision | None]:
        """Decide about one tool call: Continue, Rewrite, Skip, Pause or Finish.

        Returns:
            None or ``Continue()`` to run the call as the model made it; ``Rewrite`` to
                run it with other input; ``Skip`` to record a result or error without
                running it; ``Pause`` to pause the run before it; ``Finish`` to complete the
                run. Anything else fails the run (``InvalidArgument``).
        """
        return None

    def on_tool_call_completed(self, run: Run, call: ToolCallRecord) -> MaybeAwaitable[None]:
        """Observe a finished tool call (its output or error).

        Runs after the commit of the call's result (``tool_call_completed``), once for
        each call that commit completed, and at most once per result: a crash between
        the commit and the hook skips it for good (resume goes on from the committed
        result), and a hook that raises moves the run to ``failed`` while the result
        stays committed, so ``retry`` goes on without calling it again. Tool middleware
        runs before the commit, for work a crash there must not skip. A kernel whose
        hooks define this commits each batch of results on its own, before the turn goes
        on (without it, results land with the end of the turn).
        """
        return None

    def on_turn_completed(self, run: Run, turn: Turn) -> MaybeAwaitable[Decision | None]:
        """After a turn: None (default), Continue, Pause or Finish.

        Returns:
            None for what the kernel does anyway (after an answer the run completes,
                after tool calls it takes another turn); ``Continue()`` to take another
                turn; ``Pause`` to pause before the next turn; ``Finish`` to complete the
                run. Anything else fails the run (``InvalidArgument``).
        """
        return None


HOOK_NAMES = (
    "on_turn_prepared",
    "on_model_completed",
    "on_tool_call_started",
    "on_tool_call_completed",
    "on_turn_completed",
)
"""The hooks the kernel calls; any other ``on_*`` method is a mistake."""


def check_hooks(hooks: object) -> object:
    """Return ``hooks``; an ``on_*`` method that is not a hook raises ``ConfigError``
    (a misspelt hook would otherwise never run)."""
    for name in dir(hooks):
        if not name.startswith("on_") or name in HOOK_NAMES:
            continue
        if not callable(getattr(hooks, name, None)):
            continue
        close = difflib.get_close_matches(name, HOOK_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"hooks {type(hooks).__name__}: {name!r} is not a hook"
            f" (known hooks: {', '.join(HOOK_NAMES)}){hint}"
        )
    return hooks


def overrides(hooks: object, name: str) -> bool:
    """Whether ``hooks`` has its own ``name`` (not the do-nothing default of ``Hooks``)."""
    method = getattr(hooks, name, None)
    if method is None:
        return False
    return getattr(method, "__func__", method) is not getattr(Hooks, name, None)


_JSON_FIELDS: dict[type, tuple[str, ...]] = {
    Rewrite: ("input",),
    Skip: ("result",),
    Pause: ("metadata",),
}
_DECISIONS: dict[str, tuple[type, ...]] = {
    "on_tool_call_started": (Continue, Rewrite, Skip, Pause, Finish),
    "on_turn_completed": (Continue, Pause, Finish),
}


def checked_answer(name: str, answer: Any, run: Run) -> Any:
    """What hook ``name`` returned, if the kernel can take it: None, a decision that
    hook may return, a request or result whose every field a run can store (see
    ``statekernel._records.checks``); else ``InvalidArgument`` naming the hook, the
    field and the value. ``on_tool_call_completed``'s answer is not used."""
    if answer is None:
        return None
    if name == "on_turn_prepared":
        return checked_request(answer, f"{name}: request", run.messages)
    if name == "on_model_completed":
        return checked_result(answer, f"{name}: result", total=run.usage)
    allowed = _DECISIONS.get(name)
    if allowed is None:
        return answer
    if type(answer) not in allowed:
        known = ", ".join(kind.__name__ for kind in allowed)
        raise InvalidArgument(f"{name} returned {answer!r:.80}, not None or one of {known}")
    attrs.validate(answer)  # its fields again, however it was built
    for field in _JSON_FIELDS.get(type(answer), ()):
        problem = json_problem(getattr(answer, field), f"{type(answer).__name__}.{field}")
        if problem is not None:
            raise InvalidArgument(f"{name}: {problem}")
    return answer


async def call_hook(hooks: object, name: str, *args: Any) -> Any:
    """Call ``hooks.name(*args)`` if it exists, awaiting it when it is async; what it
    returns is checked (``checked_answer``: ``args[0]`` is the run)."""
    method = getattr(hooks, name, None)
    if method is None:
        return None
    result = method(*args)
    if inspect.isawaitable(result):
        result = await result
    return checked_answer(name, result, args[0])
