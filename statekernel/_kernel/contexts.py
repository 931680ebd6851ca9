"""Replacing a run's context with a function of it, compare-and-set
(``Kernel.update_context``)."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Callable
from typing import Any

from statekernel._kernel.tenancy import Tenancy
from statekernel._records.run import Run
from statekernel._records.values import checked
from statekernel.errors import ConflictError

__all__ = ["update_context"]


async def update_context(
    tenancy: Tenancy, run_id: str, fn: Callable[[Any], Any], attempts: int
) -> Run:
    """Commit ``fn(context)`` (sync or async, on a deep copy) as the run's context; on a
    concurrent commit ``fn`` is called again on the newer context, up to ``attempts``
    times, then ``ConflictError``. See ``Kernel.update_context``."""
    for attempt in range(attempts):
        async with tenancy.fresh(run_id) as driver:
            new = fn(copy.deepcopy(driver.run.context))
            if inspect.isawaitable(new):
                new = await new
            new = checked(new, "context")
            try:
                driver.stage("context_updated", data={}, context=new)
                await driver.commit()
            except ConflictError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0)
                continue
            return driver.run
    raise AssertionError("unreachable")
