"""Checks of the options and arguments of ``Kernel`` and ``delegate``, at the door.

Every check raises ``InvalidArgument`` naming the argument and the value before
anything is committed, so a value a run could not be read back with (a ``max_turns``
of ``"10"``, ``1.5`` or ``2**70``) never reaches a store, and an option that would
only fail later (a ``dispatch`` that is not a ``DispatchPolicy``, a ``nan`` timeout)
fails where it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from statekernel._kernel.dispatch import DispatchPolicy
from statekernel._records.arguments import (
    moment,
    new_run_id_arg,
    optional_count,
    optional_text,
    run_id_arg,
    seconds,
    text,
)
from statekernel._records.fallback import Fallback
from statekernel._records.limits import check_limits
from statekernel._records.messages import Message
from statekernel._records.tags import check_tags
from statekernel._records.values import checked
from statekernel.errors import InvalidArgument

__all__ = [
    "check_delegate_options",
    "check_kernel_options",
    "check_kernel_parts",
    "check_max_turns",
    "check_model",
    "check_start",
    "messages_arg",
]


def check_max_turns(value: Any, name: str = "max_turns") -> int | None:
    """A turn budget: None (no limit) or an int of at least 1."""
    return optional_count(name, value, minimum=1)


def check_model(value: Any, name: str = "model") -> str:
    """A model string's type (its ``provider/name`` form is the registry's to check)."""
    if type(value) is not str:
        raise InvalidArgument(f"{name} must be a str 'provider/name', got {value!r}")
    return text(name, value)


def check_kernel_options(
    max_turns: Any, lease_ttl: Any, busy_timeout: Any, dispatch: Any
) -> tuple[int | None, float, float]:
    """(max_turns, lease_ttl, busy_timeout) of a ``Kernel``, checked; ``dispatch`` must
    be None or a ``DispatchPolicy``."""
    if dispatch is not None and not isinstance(dispatch, DispatchPolicy):
        raise InvalidArgument(f"dispatch must be None or a DispatchPolicy, got {dispatch!r}")
    return (
        check_max_turns(max_turns),
        seconds("lease_ttl", lease_ttl),
        seconds("busy_timeout", busy_timeout, zero=True),
    )


def check_lease_margin(lease_margin: Any, lease_ttl: float) -> float:
    """A ``Kernel``'s ``lease_margin``, checked (None: a third of ``lease_ttl``)."""
    if lease_margin is None:
        return lease_ttl / 3
    margin = seconds("lease_margin", lease_margin, zero=True)
    if not margin < lease_ttl:
        raise InvalidArgument(
            f"lease_margin must be less than lease_ttl ({lease_ttl!r}), got {lease_margin!r}"
        )
    return margin


def check_kernel_parts(
    tools: Any, providers: Any, middleware: Any, *, registry: type
) -> tuple[list[Any], tuple[Any, ...]]:
    """(tools, middleware) of a ``Kernel`` as lists: each must be a collection (of tools,
    of functions); ``providers`` None, a mapping of names to providers or a ``registry``
    (``ProviderRegistry``)."""
    for name, value in (("tools", tools), ("middleware", middleware)):
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
            raise InvalidArgument(f"{name} must be a list, got {value!r:.80}")
    chain = tuple(middleware)
    for i, item in enumerate(chain):
        if not callable(item):
            raise InvalidArgument(f"middleware[{i}] must be a function, got {item!r:.80}")
    if providers is not None and not isinstance(providers, Mapping | registry):
        raise InvalidArgument(
            "providers must be None, a dict of providers by name or a ProviderRegistry,"
            f" got {providers!r:.80}"
        )
    return list(tools), chain


def messages_arg(messages: Any, name: str = "messages") -> Iterable[Any]:
    """``messages`` if it is a collection of messages (or strings); a single string or
    message (which would be read as its characters, or not at all) is refused."""
    if isinstance(messages, str | bytes | Message | dict) or not isinstance(messages, Iterable):
        raise InvalidArgument(
            f"{name} must be a list of messages or strings, got {type(messages).__name__}"
            f" {messages!r:.80}"
        )
    return messages


def check_start(
    model: Any,
    messages: Any,
    run_id: Any,
    max_turns: Any,
    parent_run_id: Any,
    parent_call_id: Any,
    *,
    missing: object,
) -> None:
    """The arguments of ``Kernel.start`` (``missing``: ``max_turns`` was not given)."""
    check_model(model)
    messages_arg(messages)
    if run_id is not None:
        new_run_id_arg(run_id)
    if max_turns is not missing:
        check_max_turns(max_turns)
    if parent_run_id is not None:
        run_id_arg(parent_run_id, "parent_run_id")
    if parent_call_id is not None:
        text("parent_call_id", parent_call_id)


def check_delegate_options(
    model: Any,
    instructions: Any,
    context: Any,
    max_turns: Any,
    queue: Any,
    poll: Any,
    limits: Any = None,
    tags: Any = None,
) -> dict[str, str]:
    """The options of ``delegate``: a model string or a ``Fallback`` chain, instructions
    that are None or a str, a context of JSON, a turn budget, a queue name, a finite
    ``poll`` above 0, None or ``Limits``, tags (``InvalidTag``). Returns the tags."""
    if not isinstance(model, Fallback):
        if type(model) is not str:
            raise InvalidArgument(
                f"model must be a str 'provider/name' or a statekernel.Fallback, got {model!r:.80}"
            )
        text("model", model)
    optional_text("instructions", instructions, empty=True)
    if context is not None:
        checked(context, "context")
    check_max_turns(max_turns)
    optional_text("queue", queue)
    seconds("poll", poll)
    check_limits(limits)
    return {} if tags is None else check_tags(tags)


def run_deadline(deadline: Any, timeout: Any) -> datetime | None:
    """A new run's deadline from ``start(deadline=|timeout=)``: an aware ``datetime``, or
    ``timeout`` seconds from now (positive, finite); at most one of them; None: none."""
    return moment(deadline, timeout)
