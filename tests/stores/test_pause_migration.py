"""Runs stored at schema version 1 (pause details in free ``metadata``, a call a hook's
``Finish`` skipped known only by its error text) load into the typed pause details on
every store, and ``resume`` and ``resolve_tool_call`` work on them.

Each run is driven by a real kernel, then its stored records are rewritten in the
version 1 shape (``_v1_head``, ``_v1_turn``, ``_v1_entry``: the shape the release
before typed pauses wrote) through the store's ``RawDocuments``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel._records import convert
from statekernel._records.run import PauseInfo
from statekernel.pauses import ChildWait, HookPause, MaxTurns, Question, Uncertain
from statekernel.stores import CheckpointStore, open_store
from statekernel.stores._format.blobs import escape
from statekernel.stores._format.converter import NO_BLOBS, reading
from statekernel.testing import (
    Crash,
    CrashAt,
    FaultPlan,
    FileRecords,
    MemoryRecords,
    RedisRecords,
    ScriptedProvider,
    SQLiteRecords,
    call,
)
from statekernel.testing._raw import RawDocuments

KINDS = ["memory", "file", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
RAW: dict[str, RawDocuments] = {
    "memory": MemoryRecords(),
    "file": FileRecords(),
    "sqlite": SQLiteRecords(),
    "redis": RedisRecords(),
}


# -- the version 1 shape -----------------------------------------------------------------


def _v1_pause(doc: dict[str, Any]) -> dict[str, Any]:
    with reading(NO_BLOBS) as conv:
        info = conv.load(doc, PauseInfo, "pause")
    out = {"reason": doc["reason"], "resume_to": doc["resume_to"]}
    if info.metadata:
        out["metadata"] = escape(info.metadata)
    return out


def _v1_records(doc: dict[str, Any]) -> dict[str, Any]:
    for key in ("pending", "in_flight", "completed"):
        for record in doc.get(key, ()):
            record.pop("skipped", None)
    return doc


def _v1_turn(doc: dict[str, Any]) -> dict[str, Any]:
    return _v1_records(doc)


def _v1_head(doc: dict[str, Any]) -> dict[str, Any]:
    doc["schema_version"] = 1
    for key in ("pause", "pending_pause"):
        if key in doc:
            doc[key] = _v1_pause(doc[key])
    if "current_turn" in doc:
        _v1_turn(doc["current_turn"])
    return doc


def _v1_entry(entry: dict[str, Any]) -> dict[str, Any]:
    if "f" in entry:
        _v1_head(entry["f"])
    patch = entry.get("p", {})
    for key in ("pause", "pending_pause"):
        if isinstance(patch.get(key), dict):
            patch[key] = _v1_pause(patch[key])
    if "current_turn" in patch:
        _v1_turn(patch["current_turn"])
    if "~current_turn" in patch:
        _v1_records(patch["~current_turn"])
    return entry


_V1 = {"head": _v1_head, "entry": _v1_entry, "turn": _v1_turn}


async def _make_v1(store: CheckpointStore, raw: RawDocuments, run_id: str) -> None:
    """Rewrite the run's head, commit log and turns as version 1 wrote them."""
    for key, data in (await raw.read(store, run_id)).items():
        change = _V1.get(key[0])
        if change is not None:
            doc = change(raw.decode(key, data))
            await raw.write(store, run_id, key, raw.encode(key, doc, data))


def _stored_version(raw: RawDocuments, records: dict[Any, bytes]) -> int:
    head = raw.decode(("head", 0), records[("head", 0)])
    return int(head["schema_version"])


# -- the agents ----------------------------------------------------------------------------


@sk.tool
def charge(amount: int) -> str:
    """Charge a card (not idempotent)."""
    return f"charged {amount}"


@sk.tool
def transfer(amount: int) -> str:
    """Move money."""
    return f"moved {amount}"


class Approvals(sk.Hooks):
    """Pauses every call until it is approved; ``stop`` finishes the run instead."""

    def on_tool_call_started(self, run: sk.Run, record: sk.ToolCallRecord) -> sk.Decision | None:
        if record.name == "stop":
            return sk.Finish("enough said")
        if record.name == "transfer" and run.resume_value != {"approve": record.id}:
            return sk.Pause("approval", {"call": record.id, "$odd": ["key"]})
        return None


@sk.tool
def stop() -> str:
    """Never runs: the hook finishes the run first."""
    return "ran"


def _kernel(
    store: CheckpointStore, parent: list[object], helper: list[object] | None = None, **kw: Any
) -> sk.Kernel:
    payer = sk.delegate("payer", "Pay.", model="helper/small", tools=[transfer], hooks=Approvals())
    asker = sk.ask_user("ask", answer_schema={"type": "string", "$comment": "a word"})
    providers = {
        "scripted": ScriptedProvider(parent),
        "helper": ScriptedProvider(
            helper
            if helper is not None
            else [call("transfer", {"amount": 5}, id="t1"), "transferred"]
        ),
    }
    tools = [charge, transfer, stop, asker, payer]
    return sk.Kernel(store, tools=tools, hooks=Approvals(), providers=providers, **kw)


async def _drive(kernel: sk.Kernel, run_id: str) -> sk.Run:
    async for _ in kernel.run(run_id):
        pass
    return await kernel.get(run_id)


@asynccontextmanager
async def _store(url: str) -> AsyncIterator[CheckpointStore]:
    store = open_store(url)
    try:
        yield store
    finally:
        await store.aclose()


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "file":
        return f"file://{tmp_path}/runs"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    return str(request.getfixturevalue("redis_store_url"))


# -- the test ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_runs_stored_at_version_1_load_typed_and_go_on(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    raw = RAW[kind]
    async with _store(_url(kind, tmp_path, request)) as store:
        ask_twice = [call("ask", {"question": "colour?"}), call("ask", {"question": "size?"})]
        scripts: dict[str, list[object]] = {
            "uncertain": [[call("charge", {"amount": 1}), call("charge", {"amount": 2})], "ok"],
            "question": [ask_twice, "asked"],
            "child": [call("payer", {"task": "pay 5"}, id="p1"), "paid"],
            "turns": [call("charge", {"amount": 3}), "never"],
            "hook": [call("transfer", {"amount": 9}, id="x1"), "sent"],
            "skipped": [[call("stop", {}), call("charge", {"amount": 4})], "never"],
        }
        for run_id, script in scripts.items():
            if run_id == "uncertain":  # a crash after the calls' effects: outcome unknown
                plan = FaultPlan([CrashAt("tool_after_effect", 1)])
                crashing = _kernel(store, script, middleware=[plan.middleware()])
                await crashing.start(model="scripted/m", messages=["go"], run_id=run_id)
                with pytest.raises(Crash):
                    await _drive(crashing, run_id)
                await crashing.aclose()
            kernel = _kernel(store, script)
            if run_id != "uncertain":
                budget = 1 if run_id == "turns" else None
                await kernel.start(
                    model="scripted/m", messages=["go"], run_id=run_id, max_turns=budget
                )
            await _drive(kernel, run_id)
            if run_id == "uncertain":  # one answer given before the version changes
                first = await kernel.get(run_id)
                assert isinstance(first.pause and first.pause.details, Uncertain)
                await kernel.resolve_tool_call(run_id, "call_0_0", output="charged 1")
            await kernel.aclose()
        before = {
            run_id: await store.load(run_id)
            for run_id in [*scripts, sk.child_run_id("child", "p1")]
        }
        for run_id in before:
            await _make_v1(store, raw, run_id)
            assert _stored_version(raw, await raw.read(store, run_id)) == 1

        # every run loads as it was committed, with the typed details
        for run_id, run in before.items():
            loaded = await store.load(run_id)
            assert loaded == run, f"{run_id} differs after the migration"
            assert list(loaded.turns) == list(run.turns)
        paused = {run_id: (await store.load(run_id)).pause for run_id in before}
        uncertain = paused["uncertain"]
        assert uncertain is not None
        assert isinstance(uncertain.details, Uncertain)
        assert [c.id for c in uncertain.details.unresolved] == ["call_0_1"]
        assert uncertain.metadata["resolutions"] == {
            "call_0_0": {"output": "charged 1", "attempt": 1}
        }
        question = paused["question"]
        assert question is not None
        assert isinstance(question.details, Question)
        assert [a.question for a in question.details.asks] == ["colour?", "size?"]
        assert question.details.asked.schema == {"type": "string", "$comment": "a word"}
        child = paused["child"]
        assert child is not None
        assert isinstance(child.details, ChildWait)
        assert child.details.child == "child.p1"
        assert child.details.child_pause is not None
        assert child.details.child_pause.metadata == {"call": "t1", "$odd": ["key"]}
        turns = paused["turns"]
        assert turns is not None
        assert turns.details == MaxTurns(1, 1)
        hook = paused["hook"]
        assert hook is not None
        assert hook.details == HookPause({"call": "x1", "$odd": ["key"]})
        skipped = (await store.load("skipped")).turns[0].completed
        assert [r.skipped for r in skipped] == ["enough said", "enough said"]
        assert skipped[0].error == "not run: the run finished (enough said)"
        listed = {s.run_id: s.pause for s in (await store.list_runs()).runs}
        assert listed["question"] == question, "a listing reads the migrated pause"

        # and they go on
        kernel = _kernel(store, ["after"])
        await kernel.resolve_tool_call("uncertain", "call_0_1", error="declined")
        await kernel.resume("question", value="red")
        again = await kernel.get("question")
        assert again.pause is not None
        assert isinstance(again.pause.details, Question)
        assert again.pause.details.asked.question == "size?"
        await kernel.resume("question", value="small")
        await kernel.resume("child.p1", value={"approve": "t1"})
        await kernel.resume("child")
        await kernel.resume("turns", max_turns=3)
        await kernel.resume("hook", value={"approve": "x1"})
        await kernel.aclose()
        for run_id, script in scripts.items():
            if run_id == "skipped":
                continue
            kernel = _kernel(store, script)
            final = await _drive(kernel, run_id)
            await kernel.aclose()
            assert final.state == "completed", f"{run_id} is {final.state}: {final.failure}"
            assert final.schema_version == convert.SCHEMA_VERSION
        outputs = [r.output for r in (await store.load("question")).turns[0].completed]
        assert outputs == ["red", "small"]
        charged = (await store.load("uncertain")).turns[0].completed
        assert [(r.output, r.error, r.resolved) for r in charged] == [
            ("charged 1", None, True),
            (None, "declined", True),
        ]
        paid = (await store.load("child")).turns[0].completed[0]
        assert paid.output == "transferred"
