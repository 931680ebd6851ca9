"""What a request may see of the runs it did not name itself: every run a response names
(a list row, a search hit, a child in a tree, a parent, a live notice) is first put to the
``authorize`` hook as ``view``; a refused run is left out without a trace (never named,
counted or hinted at)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import attrs
from starlette.requests import Request

from statekernel.pauses import ChildWait
from statekernel.stores import RunSummary
from statekernel.web.context import WebContext
from statekernel.web.views import ListRow, list_row

__all__ = ["NamesRun", "shown_rows", "visible", "visible_ids"]


class NamesRun(Protocol):
    """Anything a response shows about one run."""

    @property
    def run_id(self) -> str:
        """The run it is about."""
        ...


T = TypeVar("T", bound=NamesRun)


async def visible_ids(web: WebContext, request: Request, run_ids: Iterable[str]) -> set[str]:
    """The ids of ``run_ids`` the request may view (all of them without a hook)."""
    ids = set(run_ids)
    if web.authorize_hook is None:
        return ids
    return {run_id for run_id in ids if await web.authorized(request, "view", run_id)}


async def visible(web: WebContext, request: Request, items: Sequence[T]) -> list[T]:
    """The ``items`` the request may view, in their order."""
    allowed = await visible_ids(web, request, (i.run_id for i in items))
    return [i for i in items if i.run_id in allowed]


async def shown_rows(
    web: WebContext, request: Request, summaries: Sequence[RunSummary]
) -> list[ListRow]:
    """The list rows of the ``summaries`` the request may view; a run waiting for a child
    run the request may not view says it waits for "a child run", not which."""
    rows: list[ListRow] = []
    for summary in await visible(web, request, summaries):
        row = list_row(summary)
        pause = summary.pause
        details = pause.details if pause is not None else None
        if (
            pause is not None
            and isinstance(details, ChildWait)
            and not await visible_ids(web, request, [details.child])
        ):
            row = attrs.evolve(row, waiting_for=f"{pause.reason}: a child run")
        rows.append(row)
    return rows
