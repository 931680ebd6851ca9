"""Waiting for work that cannot be interrupted to end, even when the waiter is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

__all__ = ["wait_ended"]


async def wait_ended(futures: Collection[asyncio.Future[Any]]) -> None:
    """Return once every future is done.

    A cancellation that arrives meanwhile does not cut the wait short: it is raised
    (as ``CancelledError``) after the last future is done. Outcomes are not collected.
    """
    pending = set(futures)
    cancelled = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
