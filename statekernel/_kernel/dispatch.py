"""Which pending tool calls may start now, and which calls are the same call."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import attrs

from statekernel._kernel.tools import Tool
from statekernel._records.arguments import count, flag
from statekernel._records.run import ToolCallRecord

__all__ = ["DispatchPolicy", "identical_group", "next_startable"]


@attrs.frozen
class DispatchPolicy:
    """How the tool calls of one turn run.

    ``max_concurrent``: at most this many calls at once (0 = unlimited). Tools with
    ``concurrency_safe=False`` run alone. ``merge_identical``: identical calls (same
    tool, same arguments) of an *idempotent* tool in one turn run once and share the
    result; calls of any other tool always run one by one (two identical payments
    asked for in one answer are two payments). ``merge_identical=False`` runs every
    call. Results always go back to the model in the order the model asked for them.

    ``eager``: a call whose arguments have finished streaming starts before the model's
    answer ends, within the rules above (calls still start in call order). Its intent is
    committed first, together with the answer so far. Merging joins calls that have not
    started: a call identical to one that already started runs on its own (its tool is
    idempotent, so that is safe). If the answer is cut off after calls started (its
    stream fails, or the process dies), the answer committed with them is the turn's
    answer: nothing is asked of the model again, the started calls finish (or resume
    decides about them as about any call in flight), and the model reads their results
    in the next turn.
    """

    max_concurrent: int = 4
    merge_identical: bool = True
    eager: bool = False

    def __attrs_post_init__(self) -> None:
        count("max_concurrent", self.max_concurrent)
        flag("merge_identical", self.merge_identical)
        flag("eager", self.eager)


def _safe(tools: Mapping[str, Tool], name: str) -> bool:
    tool = tools.get(name)
    return tool is None or tool.concurrency_safe


def next_startable(
    pending: Sequence[ToolCallRecord],
    running: Collection[str],
    tools: Mapping[str, Tool],
    policy: DispatchPolicy,
) -> ToolCallRecord | None:
    """The first pending call (in call order) allowed to start while ``running`` run."""
    if not pending:
        return None
    if policy.max_concurrent and len(running) >= policy.max_concurrent:
        return None
    if any(not _safe(tools, name) for name in running):
        return None
    first = pending[0]
    if running and not _safe(tools, first.name):
        return None
    return first


def identical_group(
    record: ToolCallRecord,
    pending: Sequence[ToolCallRecord],
    tools: Mapping[str, Tool],
    policy: DispatchPolicy,
) -> list[str]:
    """Ids of ``record`` and the pending calls that share its run: those identical to it
    (same tool and arguments) if the policy merges and the tool is idempotent."""
    tool = tools.get(record.name)
    if not (policy.merge_identical and tool is not None and tool.idempotent):
        return [record.id]
    same = [
        r.id
        for r in pending
        if r.id != record.id
        and r.name == record.name
        and r.input == record.input
        and r.input is not None
    ]
    return [record.id, *same]
