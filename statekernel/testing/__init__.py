"""Testing helpers for users' own agents and stores: a scripted model, conformance
suites, crash/resume fuzzing and a manual clock for lease expiry."""

from __future__ import annotations

from statekernel.providers._scripted import Fail, Reply, ScriptedProvider, call
from statekernel.testing._cassette import Cassette, request_key
from statekernel.testing._clock import ManualClock
from statekernel.testing._faults import (
    CRASH_POINTS,
    Crash,
    CrashAt,
    CrashPoint,
    FaultPlan,
    FaultyProvider,
    FaultyStore,
)
from statekernel.testing._fuzz import CrashResumeReport, Ledger, check_crash_resume, fuzz_agent
from statekernel.testing._raw import (
    FileRecords,
    MemoryRecords,
    RawCopies,
    RawDocuments,
    RawRecords,
    RecordKey,
    RedisRecords,
    SQLiteRecords,
)
from statekernel.testing._raw_postgres import PostgresRecords
from statekernel.testing._servers import redis_server_path
from statekernel.testing._store_check import StoreFactory, check_store

__all__ = [
    "CRASH_POINTS",
    "Cassette",
    "Crash",
    "CrashAt",
    "CrashPoint",
    "CrashResumeReport",
    "Fail",
    "FaultPlan",
    "FaultyProvider",
    "FaultyStore",
    "FileRecords",
    "Ledger",
    "ManualClock",
    "MemoryRecords",
    "PostgresRecords",
    "RawCopies",
    "RawDocuments",
    "RawRecords",
    "RecordKey",
    "RedisRecords",
    "Reply",
    "SQLiteRecords",
    "ScriptedProvider",
    "StoreFactory",
    "call",
    "check_crash_resume",
    "check_store",
    "fuzz_agent",
    "redis_server_path",
    "request_key",
]
