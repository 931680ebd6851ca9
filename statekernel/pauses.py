"""What a paused run waits for: ``Run.pause.details``, typed.

``details`` is one of ``Uncertain`` (calls whose outcome is unknown and the
resolutions given so far: ``ResolvedOutput``, ``ResolvedError``, ``Rerun``),
``Question`` (calls that asked the user, each an ``Ask``), ``ChildWait`` (a call waiting
for a paused child run, its pause a ``ChildPause``), ``MaxTurns``, ``LimitReached`` (a
usage limit of ``Limits`` reached) or ``HookPause`` (a
hook's ``Pause``, its metadata free JSON). ``Run.pause.metadata`` is their JSON view.
"""

from __future__ import annotations

from statekernel._records.pauses import (
    Ask,
    ChildPause,
    ChildWait,
    HookPause,
    LimitReached,
    MaxTurns,
    PauseDetails,
    Question,
    Rerun,
    Resolution,
    ResolvedError,
    ResolvedOutput,
    Uncertain,
    UncertainCall,
)

__all__ = [
    "Ask",
    "ChildPause",
    "ChildWait",
    "HookPause",
    "LimitReached",
    "MaxTurns",
    "PauseDetails",
    "Question",
    "Rerun",
    "Resolution",
    "ResolvedError",
    "ResolvedOutput",
    "Uncertain",
    "UncertainCall",
]
