"""A run that its workflow starts: ``start_run_workflow``'s ``model``, ``messages``,
``context``, ``limits`` and ``tags`` as the plain JSON a workflow's history holds, made by
statekernel's converter (a ``Fallback`` chain, ``Limits`` and messages in their records'
plain form), and back into ``Kernel.start``'s arguments in the worker that starts it. A
command's ``Limits`` (the ``resume`` update's) travel the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statekernel._kernel.options import check_model, messages_arg
from statekernel._records.convert import structure, unstructure
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits, check_limits
from statekernel._records.messages import JSON, Message
from statekernel._records.tags import check_tags
from statekernel._records.values import check_messages, checked
from statekernel.errors import InvalidArgument

__all__ = ["limits_of", "start_arguments", "start_spec"]


def start_spec(
    model: str | Fallback,
    messages: Iterable[Message | str],
    context: JSON,
    limits: Limits | None,
    tags: Mapping[str, str] | None,
) -> dict[str, Any]:
    """``Kernel.start``'s arguments, checked, as plain JSON.

    Raises:
        InvalidArgument: an argument ``Kernel.start`` would refuse (``InvalidTag`` for a tag).
    """
    if not isinstance(model, Fallback):
        provider, sep, name = check_model(model).partition("/")
        if not (provider and sep and name):
            raise InvalidArgument(f"model must look like 'provider/name', got {model!r}")
    given: list[Message] = []
    for message in messages_arg(messages):
        if isinstance(message, str):
            message = Message.user(message)
        if not isinstance(message, Message):
            raise InvalidArgument(f"not a message: {message!r:.80}")
        given.append(message)
    check_messages(given)
    return {
        "model": unstructure(model) if isinstance(model, Fallback) else model,
        "messages": [unstructure(m) for m in given],
        "context": None if context is None else checked(context, "context"),
        "limits": None if check_limits(limits) is None else unstructure(limits),
        "tags": None if tags is None else check_tags(tags),
    }


def start_arguments(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``start_spec``'s JSON back as ``Kernel.start``'s keyword arguments.

    Raises:
        CorruptCheckpoint: it does not hold what ``start_spec`` makes.
    """
    model = spec.get("model")
    if isinstance(model, dict):
        model = structure(model, Fallback, what="the start's model")
    return {
        "model": model,
        "messages": [
            structure(m, Message, what="a start's message") for m in spec.get("messages", [])
        ],
        "context": spec.get("context"),
        "limits": limits_of(spec.get("limits")),
        "tags": spec.get("tags"),
    }


def limits_of(data: Any) -> Limits | None:
    """A ``Limits`` from its plain form (``statekernel.to_plain(limits)``, or with only the
    limits set); None for None."""
    return None if data is None else structure(data, Limits, what="limits")
