"""Typed pause details: what a paused run waits for, one record per kind of pause.

``PauseInfo.details`` is one of ``Uncertain`` (calls whose outcome is unknown, with the
operator's resolutions), ``Question`` (calls that asked the user), ``ChildWait`` (a
call waiting for a paused child run), ``MaxTurns`` (the turn budget is spent),
``LimitReached`` (a usage limit is reached) or ``HookPause`` (a hook's own pause, its
metadata free JSON). Code reads their fields; ``metadata`` gives the JSON view users
and ``--json`` read (the same documents as before pauses were typed).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, TypeAlias

import attrs

from statekernel._records.arguments import moment
from statekernel._records.messages import JSON
from statekernel._records.values import as_stored
from statekernel.errors import InvalidArgument

__all__ = [
    "FAIL",
    "Ask",
    "ChildPause",
    "ChildWait",
    "HookPause",
    "LimitReached",
    "MaxTurns",
    "PauseDetails",
    "PauseTimer",
    "Question",
    "Rerun",
    "Resolution",
    "ResolvedError",
    "ResolvedOutput",
    "Uncertain",
    "UncertainCall",
    "resolution_of",
    "make_timer",
    "resolutions_in",
    "timer_of",
    "without_timer",
]


@attrs.frozen
class UncertainCall:
    """A call left in flight by a stopped driver: its id, tool, input and attempt.

    ``returned``: the call ran and returned a value of this type that the store cannot
    hold (not JSON), so its output is unknown to the store; None when whether it ran at
    all is unknown (a crash).
    """

    id: str
    name: str
    input: JSON = None
    attempt: int = 0
    returned: str | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        """The call as JSON (``{"id", "name", "input", "attempt"}``, with ``"returned"``
        when the call ran and returned a value that could not be stored)."""
        doc: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "input": self.input,
            "attempt": self.attempt,
        }
        if self.returned is not None:
            doc["returned"] = self.returned
        return doc


@attrs.frozen
class ResolvedOutput:
    """An operator's word: attempt ``attempt`` of the call ran and returned ``output``."""

    attempt: int
    output: JSON = None

    @property
    def metadata(self) -> dict[str, Any]:
        """The resolution as JSON (``{"output", "attempt"}``)."""
        return {"output": self.output, "attempt": self.attempt}


@attrs.frozen
class ResolvedError:
    """An operator's word: attempt ``attempt`` of the call failed with ``error``."""

    attempt: int
    error: str

    @property
    def metadata(self) -> dict[str, Any]:
        """The resolution as JSON (``{"error", "attempt"}``)."""
        return {"error": self.error, "attempt": self.attempt}


@attrs.frozen
class Rerun:
    """An operator's word: attempt ``attempt`` of the call did not happen; run it again."""

    attempt: int

    @property
    def metadata(self) -> dict[str, Any]:
        """The resolution as JSON (``{"rerun": true, "attempt"}``)."""
        return {"rerun": True, "attempt": self.attempt}


Resolution: TypeAlias = ResolvedOutput | ResolvedError | Rerun
"""What an operator said happened to one attempt of an uncertain call."""


def resolution_of(doc: object, where: str = "resolution") -> Resolution:
    """A resolution given as JSON, as ``Resolution.metadata`` gives it (e.g. in a
    ``resume`` value): ``attempt`` with exactly one of ``output``, ``error`` (a str) or
    ``rerun`` (true).

    Returns:
        The resolution.

    Raises:
        InvalidArgument: ``doc`` is anything else, naming ``where`` and what is wrong
            (a misspelt key, an error that is not a str, a rerun that is not true would
            otherwise be read as something the operator did not say).
    """
    if not isinstance(doc, Mapping):
        raise InvalidArgument(f"{where} must be a JSON object, got {doc!r:.80}")
    attempt = doc.get("attempt")
    if type(attempt) is not int or attempt < 0:
        raise InvalidArgument(f"{where}: attempt must be an int of at least 0, got {attempt!r:.80}")
    said = sorted(set(doc) - {"attempt"})
    if said == ["rerun"] and doc["rerun"] is True:
        return Rerun(attempt)
    if said == ["error"] and type(doc["error"]) is str:
        return ResolvedError(attempt, doc["error"])
    if said == ["output"]:
        return ResolvedOutput(attempt, doc["output"])
    if said == ["rerun"]:
        raise InvalidArgument(f"{where}: rerun must be true, got {doc['rerun']!r:.80}")
    if said == ["error"]:
        raise InvalidArgument(f"{where}: error must be a str, got {doc['error']!r:.80}")
    raise InvalidArgument(
        f"{where} must hold attempt and exactly one of output, error or rerun,"
        f" got keys {said!r:.200}"
    )


def resolutions_in(value: object, uncertain: Uncertain) -> dict[str, Resolution]:
    """The resolutions a ``resume`` value hands in for ``uncertain``'s calls
    (``{"resolutions": {call id: resolution}}``, as ``Uncertain.metadata`` gives them).

    Returns:
        The resolutions by call id; empty when ``value`` holds no ``resolutions``.

    Raises:
        InvalidArgument: ``resolutions`` is not an object, names a call that is not one
            of the uncertain calls, answers another attempt than the one in flight, or
            holds something that is not a resolution (each named).
    """
    if not isinstance(value, Mapping) or "resolutions" not in value:
        return {}
    given = value["resolutions"]
    if not isinstance(given, Mapping):
        raise InvalidArgument(f"resolutions must be a JSON object by call id, got {given!r:.80}")
    found: dict[str, Resolution] = {}
    for call_id, doc in given.items():
        call = uncertain.call(call_id)
        if call is None:
            known = ", ".join(c.id for c in uncertain.calls)
            raise InvalidArgument(f"{call_id!r:.80} is not an uncertain call (they are: {known})")
        resolution = resolution_of(doc, f"resolutions[{call_id!r}]")
        if resolution.attempt != call.attempt:
            raise InvalidArgument(
                f"resolutions[{call_id!r}] answers attempt {resolution.attempt}; the attempt"
                f" in flight is {call.attempt}"
            )
        found[call_id] = resolution
    return found


@attrs.frozen
class Uncertain:
    """Pause ``uncertain_tool_calls``: the calls, and the resolutions given so far."""

    calls: tuple[UncertainCall, ...]
    resolutions: dict[str, Resolution] = attrs.field(factory=dict)

    def call(self, call_id: str) -> UncertainCall | None:
        """The uncertain call with this id, if any.

        Returns:
            The call, or None when no uncertain call has id ``call_id``.
        """
        return next((c for c in self.calls if c.id == call_id), None)

    @property
    def unresolved(self) -> tuple[UncertainCall, ...]:
        """The calls without a resolution yet."""
        return tuple(c for c in self.calls if c.id not in self.resolutions)

    @property
    def metadata(self) -> dict[str, Any]:
        """``{"calls": [...], "resolutions": {call id: resolution}}`` (no
        ``resolutions`` before the first)."""
        doc: dict[str, Any] = {"calls": [c.metadata for c in self.calls]}
        if self.resolutions:
            doc["resolutions"] = {k: r.metadata for k, r in self.resolutions.items()}
        return doc


@attrs.frozen
class PauseTimer:
    """When a pause ends by itself, committed with it: at ``at`` the run resumes with
    ``value`` (a question's answer, a hook pause's resume value, a sleep's result) or,
    with ``fail``, fails with ``PauseTimedOut`` (``Pause(timeout=|until=, on_timeout=)``,
    ``ask_user(timeout=, on_timeout=)``)."""

    at: datetime
    value: JSON = None
    fail: bool = False

    @property
    def metadata(self) -> dict[str, Any]:
        """``{"at": ISO 8601, "on_timeout": value | "fail"}``."""
        return {"at": self.at.isoformat(), "on_timeout": "fail" if self.fail else self.value}


class _Fail:
    """``on_timeout=FAIL``: the run fails (``PauseTimedOut``) when the pause times out."""

    def __repr__(self) -> str:
        return "statekernel.FAIL"


FAIL: Final = _Fail()
"""``on_timeout=FAIL``: a pause that times out fails the run with ``PauseTimedOut``."""


def make_timer(
    timeout: object, until: object, on_timeout: object, *, what: str
) -> PauseTimer | None:
    """The timer of a pause asked with ``timeout`` (seconds from now, 0 included) or
    ``until`` (an aware datetime) and ``on_timeout`` (a JSON value, or ``FAIL``); None for
    neither. ``InvalidArgument`` naming ``what`` and the argument that is wrong."""
    try:
        at = moment(until, timeout, at_name="until", zero=True)
        if at is None and on_timeout is not None:
            raise InvalidArgument("on_timeout needs timeout= or until=")
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
    if at is None:
        return None
    if on_timeout is FAIL:
        return PauseTimer(at, None, fail=True)
    value, problem = as_stored(on_timeout, "on_timeout")
    if problem is not None:
        raise InvalidArgument(f"{what}: {problem}")
    return PauseTimer(at, value)


@attrs.frozen
class Ask:
    """Calls (identical ones asked once) of tool ``name`` that asked ``question``; an
    answer must satisfy ``schema`` (None: any JSON value)."""

    calls: tuple[str, ...]
    name: str
    question: JSON = None
    schema: JSON = None
    timer: PauseTimer | None = None
    """When the question stops waiting for an answer, and what is taken instead."""

    @property
    def metadata(self) -> dict[str, Any]:
        """``{"call", "calls", "name", "question", "schema", "timeout"}`` (no ``schema``
        or ``timeout`` if None)."""
        doc: dict[str, Any] = {
            "call": self.calls[0],
            "calls": list(self.calls),
            "name": self.name,
            "question": self.question,
        }
        if self.schema is not None:
            doc["schema"] = self.schema
        if self.timer is not None:
            doc["timeout"] = self.timer.metadata
        return doc


@attrs.frozen
class Question:
    """Pause ``input_required``: ``asks[0]`` is asked now, the rest wait behind it, in
    call order."""

    asks: tuple[Ask, ...] = attrs.field(validator=attrs.validators.min_len(1))

    @property
    def asked(self) -> Ask:
        """The question asked now."""
        return self.asks[0]

    @property
    def metadata(self) -> dict[str, Any]:
        """The first question's JSON, with ``"waiting"`` the others' when there are any."""
        doc = self.asks[0].metadata
        if len(self.asks) > 1:
            doc["waiting"] = [a.metadata for a in self.asks[1:]]
        return doc


@attrs.frozen
class ChildPause:
    """A child run's pause as its parent records it: its reason and metadata."""

    reason: str
    metadata: JSON = attrs.field(factory=dict)


@attrs.frozen
class ChildWait:
    """Pause ``child_paused``: calls of tool ``name`` wait for child run ``child``,
    paused as ``child_pause`` says (None: unknown)."""

    calls: tuple[str, ...]
    name: str
    child: str
    child_pause: ChildPause | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        """``{"call", "calls", "name", "child", "child_pause": {"reason", "metadata"}}``."""
        why = self.child_pause
        return {
            "call": self.calls[0],
            "calls": list(self.calls),
            "name": self.name,
            "child": self.child,
            "child_pause": {} if why is None else {"reason": why.reason, "metadata": why.metadata},
        }


@attrs.frozen
class MaxTurns:
    """Pause ``max_turns``: the run took ``turns`` of its budget of ``max_turns``."""

    max_turns: int
    turns: int

    @property
    def metadata(self) -> dict[str, Any]:
        """``{"max_turns", "turns"}``."""
        return {"max_turns": self.max_turns, "turns": self.turns}


@attrs.frozen
class LimitReached:
    """Pause ``limit_reached``: the run used ``used`` of its limit ``limit`` (a field of
    ``Limits``: ``input_tokens``, ``output_tokens``, ``total_tokens``, ``tool_calls``, or
    ``cost``, whose figures are floats), which allows ``allowed``."""

    limit: str
    used: int | float
    allowed: int | float

    @property
    def metadata(self) -> dict[str, Any]:
        """``{"limit", "used", "allowed"}``."""
        return {"limit": self.limit, "used": self.used, "allowed": self.allowed}


def _free(value: JSON) -> JSON:
    return {} if value is None else value


@attrs.frozen
class HookPause:
    """A hook's own pause (``Pause(reason, metadata)``): its metadata, free JSON as the
    hook gave it (None is ``{}``), and its timer (``Pause(timeout=|until=)``), if any."""

    metadata: JSON = attrs.field(factory=dict, converter=_free)
    timer: PauseTimer | None = None


PauseDetails: TypeAlias = Uncertain | Question | ChildWait | MaxTurns | LimitReached | HookPause
"""What a paused run waits for (``PauseInfo.details``)."""


def timer_of(details: PauseDetails) -> PauseTimer | None:
    """The timer of a pause: a hook pause's, or the question asked now's."""
    if isinstance(details, HookPause):
        return details.timer
    if isinstance(details, Question):
        return details.asked.timer
    return None


def without_timer(details: PauseDetails) -> PauseDetails:
    """``details`` whose timer fired: the pause waits on without one."""
    if isinstance(details, HookPause):
        return attrs.evolve(details, timer=None)
    if isinstance(details, Question):
        asked = attrs.evolve(details.asked, timer=None)
        return attrs.evolve(details, asks=(asked, *details.asks[1:]))
    return details
