"""Stream parsers on model-controlled input take time linear in what the model writes,
however the stream is cut: counted in characters examined, never timed."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from statekernel._storage.streamed_json import StreamedObject
from statekernel.providers import (
    ReasoningDelta,
    ResultBuilder,
    StreamEnd,
    TextDelta,
    ToolCallDelta,
)
from statekernel.providers._openai import _StreamState
from statekernel.providers._think import ThinkSplitter, split_think

N = 200_000


def _split(pieces: list[str]) -> tuple[ThinkSplitter, str, str]:
    splitter = ThinkSplitter()
    parts = [p for piece in pieces for p in splitter.feed(piece)]
    parts += splitter.end()
    reasoning = "".join(p.text for p in parts if isinstance(p, ReasoningDelta))
    text = "".join(p.text for p in parts if isinstance(p, TextDelta))
    return splitter, reasoning, text


def test_a_whitespace_prefix_cut_in_one_character_pieces_is_linear() -> None:
    pieces = [" "] * N + ["hello"]
    splitter, reasoning, text = _split(pieces)
    assert (reasoning, text) == ("", " " * N + "hello")  # the whitespace stays text
    assert splitter.examined <= 2 * len("".join(pieces))

    pieces = [" "] * N + ["<", "thi", "nk>"] + ["x"] * N + ["</", "think>"] + ["\n"] * N + ["a"]
    splitter, reasoning, text = _split(pieces)
    assert (reasoning, text) == ("x" * N, "a")
    assert splitter.examined <= 4 * len("".join(pieces))

    splitter, reasoning, text = _split([" "] * N)  # never decided: all of it is text
    assert (reasoning, text) == ("", " " * N)


def test_the_work_grows_with_the_content_not_its_square() -> None:
    counts = []
    for size in (N // 10, N):
        splitter, _, _ = _split(["\t"] * size + ["<think>"] + ["</thin"] * size + ["k>ok"])
        counts.append(splitter.examined)
    assert counts[1] <= 12 * counts[0]  # linear: ~10x; quadratic: ~100x


@given(
    lead=st.text(" \t\n", max_size=8),
    body=st.text(max_size=20),
    cuts=st.lists(st.integers(1, 5), max_size=12),
)
def test_set_aside_whitespace_splits_as_the_whole_content_does(
    lead: str, body: str, cuts: list[int]
) -> None:
    content = lead + body
    pieces, at = [], 0
    for size in cuts:
        pieces.append(content[at : at + size])
        at += size
    pieces.append(content[at:])
    _, reasoning, text = _split(pieces)
    assert (reasoning, text) == split_think(content)


def _whole(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_streamed_arguments_ending_in_braces_are_scanned_once() -> None:
    pieces = ['{"a": ['] + ["{}, "] * N + ["{}", "]", "}", " ", "\n"]
    streamed = StreamedObject()
    for piece in pieces:
        streamed.add(piece)
        assert not streamed.whole or piece in ("}", " ", "\n")
    assert streamed.whole
    assert streamed.examined <= len("".join(pieces))
    streamed.add("x")
    assert not streamed.whole  # text after the object: not one object any more


@given(
    value=st.dictionaries(
        st.text(max_size=4),
        st.recursive(st.none() | st.text(max_size=4), st.lists, max_leaves=4),
        max_size=3,
    ),
    junk=st.sampled_from(["", " ", "\n", "}", "x", '"', "{"]),
    cuts=st.lists(st.integers(1, 4), max_size=20),
)
def test_whole_is_what_parsing_the_text_says(value: object, junk: str, cuts: list[int]) -> None:
    content = json.dumps(value) + junk
    streamed, at = StreamedObject(), 0
    for size in [*cuts, len(content)]:
        streamed.add(content[at : at + size])
        at += size
        assert streamed.whole == _whole(content[:at])
    assert streamed.text == content


def test_a_complete_call_is_built_once_while_the_answer_streams_on() -> None:
    builder = ResultBuilder()
    builder.add(ToolCallDelta(0, "c1", "look", '{"q": "x"}'))
    first = builder.complete_call(0)
    builder.add(ToolCallDelta(1, "c2", "look", "{"))
    for _ in range(1000):
        builder.add(ToolCallDelta(1, None, None, '"k": 1, '))
        assert builder.complete_count() == 1
        assert builder.complete_call(0) is first  # not joined again at each part
    builder.add(ToolCallDelta(1, None, None, '"end": 2}'))
    assert builder.complete_count() == 2
    builder.add(StreamEnd("tool_calls"))
    assert [json.loads(c.arguments)["end"] for c in builder.result().tool_calls[1:]] == [2]


def test_openai_calls_without_an_index_stay_cheap() -> None:
    state = _StreamState()
    for n in range(2000):
        call = {"id": f"c{n}", "function": {"name": "f", "arguments": "{}"}}
        [delta] = state.feed({"choices": [{"delta": {"tool_calls": [call]}}]})
        assert isinstance(delta, ToolCallDelta)
        assert delta.index == n  # a new id starts a new call
    [more] = state.feed(
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "x"}}]}}]}
    )
    assert isinstance(more, ToolCallDelta)
    assert more.index == 1999
