"""What a drive holds between two commits: the results of its tool calls (``Outcome``)
and the commit it gathers (``PendingCommit``).

Transitions are applied to the driver's copy of the run one by one (``stage``) and are
committed together (``commit``). Until then the pending commit remembers the run
they build on, the events and transitions staged, the calls whose intents it carries
(they start only once it lands), the results it lands, and whether it is the driver's
own intent to call the model. Dropping what was staged is one assignment of a fresh
``PendingCommit``.
"""

from __future__ import annotations

from typing import Any

import attrs

from statekernel._records.events import Event
from statekernel._records.messages import JSON
from statekernel._records.pauses import ChildPause
from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint

__all__ = ["Outcome", "PendingCommit"]


@attrs.define
class Outcome:
    """How tool calls (``ids``: one, or identical calls run once) ended, in hand."""

    ids: tuple[str, ...]
    output: JSON = None
    error: str | None = None
    resolved: bool = False
    context: JSON = None
    skipped: str | None = None
    """The reason of a hook's ``Finish`` that kept the call from running."""
    asked: dict[str, Any] | None = None
    """What the call asked the user (``NeedsInput``): it has no result yet."""
    child: str | None = None
    """The paused child run the call waits for (``ChildPaused``): no result yet."""
    child_pause: ChildPause | None = None
    """That child's pause."""

    @property
    def waiting(self) -> bool:
        """True if the call has no result but waits (for an answer, for a child)."""
        return self.asked is not None or self.child is not None


@attrs.define
class PendingCommit:
    """The commit being gathered since the last one landed."""

    base: Run | None = None
    """The last committed run (None while nothing is staged)."""
    events: list[Event] = attrs.Factory(list)
    moves: list[tuple[str, dict[str, Any]]] = attrs.Factory(list)
    """The transitions staged (event, payload), to apply again on a newer head."""
    intents: list[tuple[list[str], JSON]] = attrs.Factory(list)
    """Calls whose ``tool_call_started`` it carries, with their input."""
    outcomes: list[Outcome] = attrs.Factory(list)
    """Results whose ``tool_call_completed`` it carries (or waiting calls it pauses for)."""
    model_intent: bool = False
    """Whether it holds the driver's intent to call the model (``model_started``, or
    calls started while the answer streams)."""
    cancels: bool = False
    """Whether it carries out the run's cancel request (``Checkpoint.cancels``)."""

    @property
    def open(self) -> bool:
        """True once a transition was staged."""
        return self.base is not None

    def must_commit(self, observing: bool) -> bool:
        """Whether it must be committed before the next effect: it holds the intent to call the
        model or to start tools, or results the hooks observe (``observing``)."""
        return self.model_intent or bool(self.intents) or (observing and bool(self.outcomes))

    def checkpoint(self, head: Run) -> Checkpoint:
        """The checkpoint that takes the store from ``base`` to ``head``."""
        assert self.base is not None, "nothing was staged"
        checkpoint = Checkpoint.appended(self.base, head, tuple(self.events))
        return attrs.evolve(checkpoint, cancels=True) if self.cancels else checkpoint
