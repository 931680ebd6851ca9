"""Typed pause details: their JSON view is the metadata schema version 1 stored (so
``pause.metadata`` reads as before), and version 1 documents migrate into them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings

from statekernel._records import convert
from statekernel._records.run import (
    CHILD_PAUSED,
    INPUT_REQUIRED,
    MAX_TURNS,
    UNCERTAIN,
    PauseInfo,
    ToolCallRecord,
)
from statekernel._records.upgrade_v1 import from_v1
from statekernel.pauses import (
    Ask,
    ChildPause,
    ChildWait,
    HookPause,
    LimitReached,
    MaxTurns,
    PauseDetails,
    Question,
    Rerun,
    ResolvedError,
    ResolvedOutput,
    Uncertain,
    UncertainCall,
)
from statekernel.testing.strategies import pause_details

_SCHEMA = {"$comment": "w", "type": "string"}
_CALLS = [
    {"attempt": 1, "id": f"call_0_{i}", "input": {"amount": i + 1}, "name": "charge"}
    for i in range(3)
]

# (details, reason, the metadata the release before typed pauses stored for that pause)
GOLDEN: list[tuple[PauseDetails, str, dict[str, Any]]] = [
    (
        Uncertain(
            tuple(UncertainCall(f"call_0_{i}", "charge", {"amount": i + 1}, 1) for i in range(3))
        ),
        UNCERTAIN,
        {"calls": _CALLS},
    ),
    (
        Uncertain(
            tuple(UncertainCall(f"call_0_{i}", "charge", {"amount": i + 1}, 1) for i in range(3)),
            {
                "call_0_0": ResolvedOutput(1, "charged by hand"),
                "call_0_1": ResolvedError(1, "declined"),
                "call_0_2": Rerun(1),
            },
        ),
        UNCERTAIN,
        {
            "calls": _CALLS,
            "resolutions": {
                "call_0_0": {"attempt": 1, "output": "charged by hand"},
                "call_0_1": {"attempt": 1, "error": "declined"},
                "call_0_2": {"attempt": 1, "rerun": True},
            },
        },
    ),
    (
        Question(
            (
                Ask(("call_0_0",), "ask", "colour?", _SCHEMA),
                Ask(("call_0_1",), "ask", "size?", _SCHEMA),
            )
        ),
        INPUT_REQUIRED,
        {
            "call": "call_0_0",
            "calls": ["call_0_0"],
            "name": "ask",
            "question": "colour?",
            "schema": _SCHEMA,
            "waiting": [
                {
                    "call": "call_0_1",
                    "calls": ["call_0_1"],
                    "name": "ask",
                    "question": "size?",
                    "schema": _SCHEMA,
                }
            ],
        },
    ),
    (
        Question((Ask(("a", "b"), "ask", {"form": [1]}),)),
        INPUT_REQUIRED,
        {"call": "a", "calls": ["a", "b"], "name": "ask", "question": {"form": [1]}},
    ),
    (
        ChildWait(
            ("p1",),
            "payer",
            "child.p1",
            ChildPause("approval", {"$odd": [1, {"$k": None}], "call": "t1"}),
        ),
        CHILD_PAUSED,
        {
            "call": "p1",
            "calls": ["p1"],
            "child": "child.p1",
            "child_pause": {
                "metadata": {"$odd": [1, {"$k": None}], "call": "t1"},
                "reason": "approval",
            },
            "name": "payer",
        },
    ),
    (
        ChildWait(("p1",), "payer", "child.p1"),
        CHILD_PAUSED,
        {"call": "p1", "calls": ["p1"], "child": "child.p1", "child_pause": {}, "name": "payer"},
    ),
    (MaxTurns(1, 1), MAX_TURNS, {"max_turns": 1, "turns": 1}),
    (
        HookPause({"$odd": [1, {"$k": None}], "call": "x1"}),
        "approval",
        {"$odd": [1, {"$k": None}], "call": "x1"},
    ),
    (HookPause({"turn": 0}), "review", {"turn": 0}),
    (HookPause(), "review", {}),
]


@pytest.mark.parametrize(("details", "reason", "stored"), GOLDEN)
def test_metadata_is_what_version_1_stored(
    details: PauseDetails, reason: str, stored: dict[str, Any]
) -> None:
    assert PauseInfo(reason, "dispatching_tools", details).metadata == stored


def _v1(reason: str, metadata: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"reason": reason, "resume_to": "dispatching_tools"}
    if metadata:
        doc["metadata"] = metadata
    return doc


def _migrated(doc: dict[str, Any]) -> PauseInfo:
    head = from_v1("head", {"pause": doc})
    return convert.structure(head["pause"], PauseInfo)


@pytest.mark.parametrize(("details", "reason", "stored"), GOLDEN)
def test_version_1_pauses_migrate_into_their_details(
    details: PauseDetails, reason: str, stored: dict[str, Any]
) -> None:
    assert _migrated(_v1(reason, stored)) == PauseInfo(reason, "dispatching_tools", details)


_REASONS = {
    Uncertain: UNCERTAIN,
    Question: INPUT_REQUIRED,
    ChildWait: CHILD_PAUSED,
    MaxTurns: MAX_TURNS,
    HookPause: "approval",
}


@settings(max_examples=200)
@given(details=pause_details())
def test_any_pause_migrates_back_from_its_version_1_metadata(details: PauseDetails) -> None:
    # version 1 kept no empty metadata, and its writers made a hook's falsy metadata {}
    assume(not isinstance(details, HookPause) or bool(details.metadata) or details.metadata == {})
    assume(not isinstance(details, LimitReached))  # no version 1 run reached a limit
    reason = _REASONS[type(details)]
    expected = PauseInfo(reason, "dispatching_tools", details)
    assert _migrated(_v1(reason, expected.metadata)) == expected


@pytest.mark.parametrize(
    ("reason", "metadata"),
    [
        (UNCERTAIN, {"calls": "not a list"}),
        (INPUT_REQUIRED, {"call": "c"}),
        (CHILD_PAUSED, {"call": "c"}),
        (MAX_TURNS, {"max_turns": 3}),
        (INPUT_REQUIRED, ["a", "list"]),
    ],
)
def test_a_hook_pause_named_like_a_kernel_pause_stays_a_hook_pause(
    reason: str, metadata: Any
) -> None:
    assert _migrated(_v1(reason, metadata)).details == HookPause(metadata)


def test_calls_a_hook_finish_skipped_migrate_with_the_reason() -> None:
    finished = "not run: the run finished (enough (said))"
    docs = [
        {"id": "a", "name": "t", "arguments": "{}", "error": finished},
        {"id": "b", "name": "t", "arguments": "{}", "error": "not run: new input arrived"},
        {"id": "c", "name": "t", "arguments": "{}", "error": {"$b": "a long error's key"}},
        {"id": "d", "name": "t", "arguments": "{}", "output": finished},
    ]
    turn = from_v1("turn", {"index": 0, "completed": docs})
    records = [convert.structure(d, ToolCallRecord) for d in turn["completed"][:2]]
    assert [r.skipped for r in records] == ["enough (said)", None]
    assert records[0].error == finished, "the text the model reads stays"
    assert "skipped" not in turn["completed"][2]
    assert "skipped" not in turn["completed"][3]


def test_a_whole_run_migrates_its_pauses_and_turns() -> None:
    record = {"id": "a", "name": "t", "arguments": "{}", "error": "not run: the run finished (x)"}
    doc = {
        "pause": _v1(MAX_TURNS, {"max_turns": 2, "turns": 2}),
        "pending_pause": _v1("later", {"k": 1}),
        "current_turn": {"index": 1, "completed": [dict(record)]},
        "turns": [{"index": 0, "completed": [dict(record)]}],
    }
    run = from_v1("run", doc)
    assert run["pause"]["details"] == {"kind": "max_turns", "max_turns": 2, "turns": 2}
    assert run["pending_pause"]["details"] == {"kind": "hook", "metadata": {"k": 1}}
    assert run["current_turn"]["completed"][0]["skipped"] == "x"
    assert run["turns"][0]["completed"][0]["skipped"] == "x"
