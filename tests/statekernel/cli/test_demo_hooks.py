"""The demo agent's hooks: one forced tool per turn, in the order its story needs."""

from __future__ import annotations

import attrs

import statekernel as sk
from statekernel._cli.demo import NOT_YET, DemoHooks, demo_tools

SPECS = tuple(t.spec for t in demo_tools())


def _request(model: str) -> sk.ModelRequest:
    return sk.ModelRequest(model, (sk.Message.user("go"),), tools=SPECS)


def _run(model: str, *completed: sk.ToolCallRecord) -> sk.Run:
    request_0 = sk.ModelRequest(model)
    turns = tuple(sk.Turn(i, request_0, completed=(r,)) for i, r in enumerate(completed))
    return sk.Run("r", model, turns=turns)


FORECAST = sk.ToolCallRecord("c1", "get_forecast", "{}", {}, output={"sky": "dry"})
RAIN = attrs.evolve(FORECAST, output={"sky": "rain"})
BOOK = sk.ToolCallRecord("c2", "book_table", "{}", {})
BOOKED = attrs.evolve(BOOK, output={"confirmation": "SK-1"})


def test_each_turn_forces_the_one_tool_the_story_needs_next() -> None:
    hooks = DemoHooks()
    for model in ("local/smollm2", "scripted/demo"):
        first = hooks.on_turn_prepared(_run(model), _request(model))
        assert first is not None
        assert [t.name for t in first.tools] == ["get_forecast"]
        assert first.tool_choice == "required"
        assert first.max_tokens is not None
        second = hooks.on_turn_prepared(_run(model, FORECAST), _request(model))
        assert second is not None
        assert [t.name for t in second.tools] == ["book_table"]
        assert second.tool_choice == "required"
        for done in (_run(model, FORECAST, BOOKED), _run(model, RAIN)):
            last = hooks.on_turn_prepared(done, _request(model))
            assert last is not None
            assert (last.tools, last.tool_choice) == ((), None)
            assert list(last.messages) == list(_request(model).messages)
            assert last.stop == ()


def test_a_forced_call_of_the_local_model_is_prefilled_and_stops_after_one() -> None:
    hooks = DemoHooks()
    local = hooks.on_turn_prepared(_run("local/smollm2"), _request("local/smollm2"))
    assert local is not None
    assert local.messages[-1] == sk.Message.assistant("<tool_call>\n")
    assert len(local.messages) == 2
    assert local.stop == ("</tool_call>",)
    other = hooks.on_turn_prepared(_run("scripted/demo"), _request("scripted/demo"))
    assert other is not None
    assert len(other.messages) == 1
    assert other.stop == ()


def test_a_booking_before_a_dry_forecast_is_skipped() -> None:
    hooks = DemoHooks()
    assert hooks.on_tool_call_started(_run("local/smollm2"), BOOK) == sk.Skip(error=NOT_YET)
    assert hooks.on_tool_call_started(_run("local/smollm2", RAIN), BOOK) == sk.Skip(error=NOT_YET)
    assert hooks.on_tool_call_started(_run("local/smollm2", FORECAST), BOOK) is None


def test_the_booking_takes_a_slot_and_a_party_size() -> None:
    params = next(s for s in SPECS if s.name == "book_table").parameters
    assert isinstance(params, dict)
    assert "20:00" in params["properties"]["time"]["enum"]
    assert params["properties"]["people"]["enum"] == [1, 2, 3, 4, 5, 6, 7, 8]
