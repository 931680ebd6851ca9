"""The workload of ``bench/anchor.py``, shared by the statekernel and LangGraph sides.

Standard library only: the LangGraph side imports it from its own venv. One user
message; turns 1..N-1 the model asks for one ``search`` call with ~200 bytes of JSON
arguments and the tool answers ~1 KB of text; turn N answers text. Arguments and
outputs differ from turn to turn (words drawn from a seeded generator), so neither
side stores a repeated string.
"""

from __future__ import annotations

import json
import random

TOOL_NAME = "search"
USER_TEXT = "Research the topic step by step with the search tool, then summarise."
RESUME_TEXT = "One more question: answer directly."
FINAL_TEXT = "Summary: the sources agree on the main points; details are in the results above."

_WORDS = (
    "agent checkpoint commit durable event history journal kernel latency ledger log message "
    "model network output page query record replay request result revision row run schema "
    "search snapshot source state step storage stream sync table thread token tool trace "
    "transaction turn update value version window write alpha beta gamma delta north south "
    "east west river mountain forest harbour market station bridge garden"
)
_VOCABULARY = tuple(_WORDS.split())


def _words(rng: random.Random, size: int) -> str:
    """Words from the vocabulary until ``size`` characters, cut to exactly ``size``."""
    parts: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_VOCABULARY)
        parts.append(word)
        length += len(word) + 1
    return " ".join(parts)[:size]


def call_id(turn: int) -> str:
    """The id of the tool call the model makes in ``turn`` (1-based)."""
    return f"call_{turn:06d}"


def tool_arguments(turn: int) -> dict[str, object]:
    """The arguments of the call in ``turn``: about 200 bytes as JSON."""
    rng = random.Random(turn)
    args: dict[str, object] = {"query": "", "limit": 10, "page": turn}
    base = len(json.dumps(args))
    args["query"] = _words(rng, 200 - base)
    return args


def tool_output(query: str) -> str:
    """What ``search`` returns for ``query``: 1024 characters, different for every query."""
    rng = random.Random(query)
    head = f"Results for {query[:40]!r}: "
    return head + _words(rng, 1024 - len(head))
