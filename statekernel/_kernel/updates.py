"""Changing a run's data with compare-and-set: its context (``Kernel.update_context``)
and its tags (``Kernel.update_tags``). Neither moves the run's state.

A new context is committed as ``context_updated``; a concurrent commit makes the
function that builds it run again on the newer context, up to ``attempts`` times.

A change of tags is committed as ``tags_updated`` (its data: the tags ``set`` and the keys
``removed``), the run's state kept. With ``expected_revision`` it lands only on that
revision of the run (``ConflictError`` otherwise, nothing written); without it, a
concurrent commit makes it apply again to the newer tags, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from statekernel._records.arguments import callable_arg, optional_count, run_id_arg
from statekernel._records.messages import JSON
from statekernel._records.run import Run
from statekernel._records.tags import MAX_TAGS, check_tag_keys, check_tags
from statekernel._records.values import checked
from statekernel.errors import ConflictError, InvalidArgument, InvalidTag

if TYPE_CHECKING:
    from statekernel._kernel.tenancy import Tenancy

__all__ = ["ATTEMPTS", "update_context", "update_tags"]

ATTEMPTS = 5
"""How many times a change without ``expected_revision`` is tried on a newer head."""


async def update_context(
    tenancy: Tenancy, run_id: str, fn: Callable[[JSON], Any], attempts: int
) -> Run:
    """Replace the run's context with ``fn(context)``; see ``Kernel.update_context``."""
    if type(attempts) is not int or attempts < 1:
        raise InvalidArgument(f"attempts must be an int of at least 1, got {attempts!r}")
    run_id_arg(run_id)
    callable_arg("fn", fn)
    for attempt in range(attempts):
        async with tenancy.fresh(run_id) as driver:
            run = driver.run
            new = fn(copy.deepcopy(run.context))
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


async def update_tags(
    tenancy: Tenancy,
    run_id: str,
    set_: Mapping[str, str] | None,
    remove: Iterable[str],
    expected_revision: int | None,
) -> Run:
    """Set the pairs of ``set_`` and remove the keys of ``remove`` (a key in both is
    refused), committed as ``tags_updated``; see ``Kernel.update_tags``."""
    run_id_arg(run_id)
    given = check_tags({} if set_ is None else set_, "set")
    gone = check_tag_keys(remove, "remove")
    both = sorted(k for k in gone if k in given)
    if both:
        raise InvalidTag(f"tag {both[0]!r} is both set and removed", key=both[0])
    expected = optional_count("expected_revision", expected_revision)
    attempts = 1 if expected is not None else ATTEMPTS
    for attempt in range(attempts):
        async with tenancy.fresh(run_id) as driver:
            run = driver.run
            if expected is not None and run.revision != expected:
                raise ConflictError(run_id, expected, run.revision)
            tags = {k: v for k, v in run.tags.items() if k not in gone}
            tags.update(given)
            if len(tags) > MAX_TAGS:
                raise InvalidTag(f"tags: {len(tags)} tags, a run carries at most {MAX_TAGS}")
            if tags == run.tags:
                return run  # nothing changes: nothing committed
            removed = sorted(k for k in gone if k in run.tags)
            try:
                data = {"set": dict(given), "removed": removed}
                driver.stage("tags_updated", data=data, tags=tags)
                await driver.commit()
            except ConflictError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0)
                continue
            return driver.run
    raise InvalidArgument("unreachable")  # pragma: no cover
