"""Records and the converter: exact JSON round trips, versions, corrupt data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

import statekernel as sk
from statekernel._records import convert
from statekernel.errors import CorruptCheckpoint
from statekernel.testing import strategies as sts


@settings(max_examples=100, deadline=None)
@given(sts.runs())
def test_run_json_round_trip_is_exact(run: sk.Run) -> None:
    text = convert.dumps(run)
    back = convert.loads(text, sk.Run)
    assert back == run
    assert convert.dumps(back) == text


@settings(max_examples=100, deadline=None)
@given(sts.messages())
def test_message_round_trip_is_exact(message: sk.Message) -> None:
    assert convert.loads(convert.dumps(message), sk.Message) == message


@settings(max_examples=50, deadline=None)
@given(sts.events("r", 3, 0))
def test_event_round_trip_is_exact(events: list[sk.Event]) -> None:
    for event in events:
        assert convert.loads(convert.dumps(event), sk.Event) == event


def test_stored_runs_carry_their_schema_version() -> None:
    data = convert.unstructure(sk.Run("r", "scripted/x"))
    assert data["schema_version"] == 2
    assert json.loads(convert.dumps(sk.Run("r", "scripted/x")))["schema_version"] == 2


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.update(schema_version=99), "unknown schema_version 99"),
        (lambda d: d.pop("schema_version"), "no schema_version"),
        (lambda d: d.pop("run_id"), "required field missing"),
        (lambda d: d.update(revision="three"), "revision"),
        (
            lambda d: d.update(messages=[{"role": "user", "content": [{"type": "video"}]}]),
            "messages",
        ),
        (lambda d: d.update(created_at=12), "created_at"),
    ],
)
def test_corrupt_or_unknown_data_raises_corrupt_checkpoint(mutate, problem: str) -> None:  # type: ignore[no-untyped-def]
    data = convert.unstructure(sk.Run("r", "scripted/x", messages=(sk.Message.user("hi"),)))
    mutate(data)
    with pytest.raises(CorruptCheckpoint) as info:
        convert.structure_run(data)
    assert problem in str(info.value)
    assert not isinstance(info.value, KeyError)


@pytest.mark.parametrize("messages", [{}, "", {"$r": [0, 1]}])
def test_a_request_in_plain_data_lists_its_messages(messages: object) -> None:
    with pytest.raises(CorruptCheckpoint):
        convert.structure({"model": "p/m", "messages": messages}, sk.ModelRequest)
    request = convert.structure({"model": "p/m", "messages": []}, sk.ModelRequest)
    assert request == sk.ModelRequest("p/m")


def test_not_json_raises_corrupt_checkpoint() -> None:
    with pytest.raises(CorruptCheckpoint, match="not JSON"):
        convert.loads('{"run_id": ', sk.Run)
    with pytest.raises(CorruptCheckpoint, match="expected an object"):
        convert.loads("[1, 2]", sk.Run)


def test_migrations_upgrade_old_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convert, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(convert, "_MIGRATIONS", {})

    def rename_ctx(kind: str, data: dict[str, object]) -> dict[str, object]:
        assert kind == "run"
        data["context"] = data.pop("ctx", {})
        return data

    convert.register_migration(1, rename_ctx)
    old = {"run_id": "r", "model": "scripted/x", "schema_version": 1, "ctx": {"a": 1}}
    old.update(created_at="2026-01-01T00:00:00+00:00", updated_at="2026-01-01T00:00:00+00:00")
    upgraded = convert.upgrade(old)
    assert upgraded["schema_version"] == 2
    assert upgraded["context"] == {"a": 1}
    monkeypatch.setattr(convert, "SCHEMA_VERSION", 3)
    with pytest.raises(CorruptCheckpoint, match="no migration from schema_version 2"):
        convert.upgrade(dict(old))


def test_message_helpers() -> None:
    m = sk.Message.assistant("hi", tool_calls=[sk.ToolCall("1", "f", '{"a": 1}')])
    assert m.text == "hi"
    assert m.tool_calls[0].parsed_arguments() == {"a": 1}
    assert sk.Message.user("x", images=[sk.ImagePart(url="u")]).content[1] == sk.ImagePart(url="u")
    assert sk.Usage(1, 2, 3, 4) + sk.Usage(1, 1, 1, 1) == sk.Usage(2, 3, 4, 5)
    assert sk.ModelRequest("openai/gpt-4o").model_name == "gpt-4o"


def test_output_is_the_final_answer_of_a_completed_run() -> None:
    from statekernel._records.messages import Message
    from statekernel._records.run import Run

    messages = (Message.user("hi"), Message.assistant("hello"), Message.user("and?"))
    assert Run("r", "p/m", state="completed", messages=messages).output == "hello"
    assert Run("r", "p/m", state="paused", messages=messages).output is None
    assert Run("r", "p/m", state="completed").output is None
