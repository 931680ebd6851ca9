"""Testing helpers for users' own agents and stores: a scripted model, conformance
suites and crash/resume fuzzing."""

from __future__ import annotations

from statekernel.testing._cassette import Cassette, request_key
from statekernel.testing._scripted import Fail, Reply, ScriptedProvider, call

__all__ = [
    "Cassette",
    "Fail",
    "Reply",
    "ScriptedProvider",
    "call",
    "request_key",
]
