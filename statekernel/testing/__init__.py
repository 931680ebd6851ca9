"""Testing helpers for users' own agents and stores: a scripted model, conformance
suites and crash/resume fuzzing."""

from __future__ import annotations

from statekernel.testing._cassette import Cassette, request_key
from statekernel.testing._scripted import Fail, Reply, ScriptedProvider, call
from statekernel.testing._store_check import StoreFactory, check_store

__all__ = [
    "Cassette",
    "Fail",
    "Reply",
    "ScriptedProvider",
    "StoreFactory",
    "call",
    "check_store",
    "request_key",
]
