"""Pause timers: a pause that ends by itself, with nobody watching.

A timer is committed with its pause (``PauseTimer`` in the pause's details): a hook's
``Pause(reason, timeout=|until=, on_timeout=...)``, a question asked with
``ask_user(timeout=, on_timeout=)`` or ``NeedsInput(..., timeout=|until=)``, a durable
sleep (``sleep_until``). Once it is due, whoever touches the run fires it first, under
the run's lease and in one commit: a drive, a step or a command of any kernel
(``settle_due``), or a worker's timer loop (``Worker(timers=True)``, ``statekernel
worker --timers``: ``statekernel._kernel.due``). Firing commits ``timer_fired`` (the
pause's details without the timer) and then either the resume with the timer's value
(a question's answer, a hook pause's resume value) or, with ``on_timeout=FAIL``, the
failure ``PauseTimedOut``. Exactly once: the commit is fenced by the lease and compares
the revision, so whoever comes second finds the run no longer due.

A run's ``deadline`` is settled the same way, before its timer: a paused run past its
deadline fails with ``DeadlineExceeded`` when touched or seen due by a worker.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs

from statekernel._kernel.drive import RunDriver, expire
from statekernel._kernel.resolving import resume_paused
from statekernel._records.events import Event
from statekernel._records.pauses import PauseTimer, without_timer
from statekernel._records.run import PAUSE_TIMED_OUT, Cancellation, Run, utcnow

__all__ = ["settle_due"]


def _due(run: Run, now: datetime) -> PauseTimer | None:
    pause = run.pause
    if run.state != "paused" or pause is None:
        return None
    timer = pause.timer
    return timer if timer is not None and timer.at <= now else None


async def settle_due(driver: RunDriver) -> tuple[Event, ...]:
    """What is due on the driver's run, done first and committed: a passed deadline
    fails it (``expire``); a due pause timer fires (see the module). The events of that
    commit, none when nothing is due."""
    events = await expire(driver)
    if events:
        return events
    run = driver.run
    timer = _due(run, utcnow())
    if timer is None or run.pause is None:
        return ()
    data: dict[str, Any] = {"reason": run.pause.reason, **timer.metadata}
    pause = run.pause
    driver.stage(
        "timer_fired", data=data, pause=attrs.evolve(pause, details=without_timer(pause.details))
    )
    if timer.fail:
        why = f"pause {pause.reason!r} timed out at {timer.at.isoformat()}"
        driver.stage("cancel", cancellation=Cancellation(why, "timer", timer.at, PAUSE_TIMED_OUT))
        return await driver.commit()
    return await resume_paused(driver, timer.value, True, None, None)
