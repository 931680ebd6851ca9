"""One drive of a run to its next rest, as ``Kernel.run`` and ``Kernel.start_and_run``
make it: take the run's driver (and lease) from the kernel's tenancy, stage new input,
advance from effect to effect until the run is at rest, and end the drive (calls
stopped, or kept when the store failed). ``step`` is one advance of it, as
``Kernel.step`` makes it; both publish their live events to other processes. How each
step moves the run, and where a crash can land, is told at the top of
``statekernel._kernel.drive``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from statekernel._kernel import telemetry
from statekernel._kernel.drive import carry_out_cancel, deadline_watch
from statekernel._kernel.failures import explained, run_failed
from statekernel._kernel.tenancy import Tenancy
from statekernel._kernel.tenure import Tenure
from statekernel._kernel.timers import settle_due
from statekernel._records.events import Event
from statekernel._records.messages import Message
from statekernel._records.pauses import Uncertain
from statekernel._records.run import Run
from statekernel._storage.publishing import publishing
from statekernel.errors import ConflictError, InvalidTransition, LeaseLost, StoreError

__all__ = ["check_input", "drive", "step"]


async def drive(
    tenancy: Tenancy,
    run_id: str,
    new_input: tuple[Message, ...] = (),
    *,
    raise_on_failure: bool = False,
    created: Run | None = None,
    tenure: Tenure | None = None,
) -> AsyncGenerator[Event, None]:
    """Drive the run until it is paused, failed or completed, yielding its events.

    ``created``: the run as the caller just committed it (revision 0), which the drive
    starts from without loading it. Should another process have committed to the run
    before its lease was taken, the drive's first commit is refused (it is made on
    revision 0): no model or tool call started (a hook before it, ``on_turn_prepared``,
    runs again, as after a crash), so the drive loads the head and goes on from there.
    ``tenure``: the run's lease, taken with its creation (else the drive takes it).

    Live events are also published (``_storage.publishing``): to the readers of this
    process at once, and to other processes on the store's feed, without waiting.
    """
    async with publishing(tenancy.store, run_id) as publisher:
        events = _drive(tenancy, run_id, new_input, raise_on_failure, created, tenure)
        async with contextlib.aclosing(events):
            async for event in events:
                if not event.persisted:
                    publisher.publish(event)
                yield event


async def _drive(
    tenancy: Tenancy,
    run_id: str,
    new_input: tuple[Message, ...],
    raise_on_failure: bool,
    created: Run | None,
    tenure: Tenure | None,
) -> AsyncGenerator[Event, None]:
    with telemetry.drive_span(run_id) as span:
        async with tenancy.driver(run_id, created, tenure) as driver:
            span.watch(driver)
            keep = False
            for event in await settle_due(driver):  # a passed deadline, a due pause timer
                yield event
            if new_input:
                with explained(driver.run):
                    check_input(driver.run)
                    driver.stage("input", messages=new_input)
            try:
                unread = created is not None  # the head was not read: a conflict reloads it
                with deadline_watch(driver):
                    while not driver.run.is_terminal:
                        try:
                            async for event in driver.advance():
                                unread = False
                                yield event
                        except LeaseLost:
                            raise  # a ConflictError, but no other commit took the revision
                        except ConflictError:
                            if not unread:
                                raise
                            unread = False
                            await driver.reset(await tenancy.store.load(run_id))
                if driver.committer.cancelling is not None and not driver.lost:
                    for event in await carry_out_cancel(driver):  # asked as it came to rest
                        yield event
                if raise_on_failure and driver.run.state == "failed":
                    raise run_failed(driver.run)
            except StoreError:
                keep = True  # the store failed: calls go on, their results wait for a drive
                raise
            except (Exception, asyncio.CancelledError, GeneratorExit):
                raise  # stopped: results in hand stay with the driver for the next drive
            except BaseException:
                driver.forget()  # the process is going down (an injected crash, an exit)
                raise
            finally:
                await driver.drive_ended(stop_tasks=not keep)


async def step(tenancy: Tenancy, run_id: str, *, raise_on_failure: bool = False) -> list[Event]:
    """Advance the run to its next commit (one step) and return the step's events.

    Its live events are published as a drive's are (``_storage.publishing``): to the
    readers of this process at once, to other processes on the store's feed.
    """
    store = tenancy.store
    async with publishing(store, run_id) as publisher, tenancy.driver(run_id) as driver:
        events = list(await settle_due(driver))  # a passed deadline, a due timer
        with deadline_watch(driver):
            async for event in driver.advance():
                if not event.persisted:
                    publisher.publish(event)
                events.append(event)
        if raise_on_failure and driver.run.state == "failed":
            raise run_failed(driver.run)
        return events


def check_input(run: Run) -> None:
    """Refuse input to a run whose uncertain tool calls must be resolved first."""
    pause = run.pause
    if run.state == "paused" and pause is not None and isinstance(pause.details, Uncertain):
        calls = ", ".join(repr(c.id) for c in pause.details.calls)
        raise InvalidTransition(
            "input",
            "paused",
            f"tool calls {calls} of run {run.run_id!r} may or may not have run: say what"
            " happened with resolve_tool_call first",
        )
