"""The workload of ``bench/stores.py`` and ``bench/stored_format.py``.

Each turn the scripted model asks for one ``get_weather`` call with ~200 bytes of
arguments (``argument``), the tool returns ~1 KB of forecast, and the last turn answers
text (``script``). Arguments and outputs differ from turn to turn.
"""

from __future__ import annotations

import json

import statekernel as sk
from statekernel.testing import call

WORDS = ["sunny", "cloudy", "rain", "wind", "light", "strong"]
WORDS += ["north", "south", "east", "west", "gusts", "showers"]
FINAL_TEXT = "It is sunny."


def argument(turn: int) -> str:
    """About 200 bytes of arguments, different in every turn."""
    return f"Paris, France (turn {turn}); " + " ".join(WORDS[(turn + i) % 12] for i in range(28))


@sk.tool
def get_weather(city: str) -> str:
    """About 1 KB of forecast, different for every input."""
    seed = sum(map(ord, city))
    hours = [
        {
            "h": h,
            "t": (seed * (h + 3)) % 35 - 5,
            "sky": WORDS[(seed + h) % 12],
            "wind": (seed + h) % 40,
        }
        for h in range(24)
    ]
    return json.dumps({"city": city[:40], "hours": hours})[:1024]


def script(turns: int) -> list[object]:
    """The model's answers of a run of ``turns`` turns: a call a turn, then the text."""
    steps: list[object] = [call("get_weather", {"city": argument(i)}) for i in range(turns - 1)]
    return [*steps, FINAL_TEXT]
