"""The rules of resolving a pause: what ``Kernel.resume`` and ``Kernel.resolve_tool_call``
stage on a run's driver once they hold the run.

A pause on a question (``input_required``) is answered by a value that becomes the
asking call's result, committed with the resume. A pause on uncertain calls is
answered call by call, one resolution per attempt in flight (``output``, ``error`` or
``rerun``); the commit of the last resolution is followed by the resume. Any other pause
(``max_turns``, ``limit_reached``, a hook's) is resumed with the value given.
"""

from __future__ import annotations

import attrs

from statekernel._kernel.drive import RunDriver
from statekernel._kernel.failures import explained
from statekernel._records.events import Event
from statekernel._records.limits import Limits, check_priced
from statekernel._records.messages import JSON
from statekernel._records.pauses import (
    Question,
    Rerun,
    Resolution,
    ResolvedError,
    ResolvedOutput,
    Uncertain,
    resolutions_in,
)
from statekernel._records.run import PauseInfo
from statekernel.errors import InvalidArgument, InvalidTransition

__all__ = ["resolve_call", "resume_paused"]


async def resume_paused(
    driver: RunDriver, value: JSON, given: bool, max_turns: int | None, limits: Limits | None
) -> tuple[Event, ...]:
    """Resume the driver's run with ``value`` (``given``: the caller gave one), raising
    its turn budget to ``max_turns`` and replacing its usage limits with ``limits``
    (None: as they were); see ``Kernel.resume``. The events committed."""
    run = driver.run
    check_priced(limits, run.model, run.fallback, driver.kernel.prices)
    pause = run.pause
    answered = _all_resolved(pause) if run.state == "paused" else None
    if answered is not None and not given:
        value = {"resolutions": answered}
    question = pause.details if pause is not None else None
    if given and run.state == "paused" and isinstance(question, Uncertain):
        resolutions_in(value, question)  # what it hands in answers these calls
    if run.state == "paused" and isinstance(question, Question):
        if not given:
            raise InvalidArgument(
                f"run {run.run_id!r} waits for an answer to {question.asked.question!r}"
                f" (a call of tool {question.asked.name!r}): give it as value="
            )
        return await driver.answer(question, value, max_turns, limits)
    with explained(run):
        driver.stage("resume", value=value, max_turns=max_turns, limits=limits)
    return await driver.commit()


async def resolve_call(
    driver: RunDriver, call_id: str, output: JSON, error: str | None, rerun: bool
) -> None:
    """Commit what happened to the uncertain call ``call_id`` of the driver's run (one of
    ``rerun``, ``error`` or ``output``), and the resume once every call has an answer;
    see ``Kernel.resolve_tool_call``."""
    run = driver.run
    pause = run.pause
    uncertain = pause.details if pause is not None else None
    if run.state != "paused" or pause is None or not isinstance(uncertain, Uncertain):
        with explained(run):
            raise InvalidTransition("resolve_tool_call", run.state, "no uncertain tool calls")
    call = uncertain.call(call_id)
    if call is None:
        raise InvalidArgument(f"{call_id!r} is not an uncertain call of run {run.run_id!r}")
    # a resolution answers for one attempt: a re-run that is itself interrupted leaves a
    # new attempt in flight, which needs a new answer
    resolution: Resolution = (
        Rerun(call.attempt)
        if rerun
        else ResolvedError(call.attempt, error)
        if error is not None
        else ResolvedOutput(call.attempt, output)
    )
    resolutions = {**uncertain.resolutions, call_id: resolution}
    details = attrs.evolve(uncertain, resolutions=resolutions)
    data = {"call_id": call_id, "resolution": resolution.metadata}
    driver.stage("tool_call_resolved", data=data, pause=attrs.evolve(pause, details=details))
    await driver.commit()
    answered = _all_resolved(driver.run.pause)
    if answered is not None:  # every call answered: go on
        driver.stage("resume", value={"resolutions": answered}, max_turns=None, limits=None)
        await driver.commit()


def _all_resolved(pause: PauseInfo | None) -> dict[str, JSON] | None:
    """The resolutions of a pause on uncertain calls once every call has one (as JSON,
    what ``resume`` hands the drive), else None."""
    details = pause.details if pause is not None else None
    if not isinstance(details, Uncertain) or details.unresolved:
        return None
    return {call_id: r.metadata for call_id, r in details.resolutions.items()}
