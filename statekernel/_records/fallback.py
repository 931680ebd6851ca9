"""A chain of models for one run (``Fallback``): the next answers when one fails.

``Kernel.start(model=Fallback("openai/gpt-4o", "anthropic/claude-sonnet-4"))`` stores
the chain with the run (``Run.fallback``; ``Run.model`` is its first model), so any
process that drives the run uses the same chain. When a model call fails in a way the
chain lists in ``on``, the next model of the chain is called with the same request.
Which errors count as which is ``fallback_kind``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeAlias, get_args

import attrs

from statekernel.errors import InvalidArgument, ProviderUnavailable, RateLimited

__all__ = [
    "DEFAULT_ON",
    "FALLBACK_KINDS",
    "Fallback",
    "FallbackOn",
    "REFUSED_FINISH",
    "fallback_kind",
    "models_after",
]

FallbackOn: TypeAlias = Literal["unavailable", "rate_limited", "refused"]
"""What a model call may fail with for the next model of a chain to be called."""

FALLBACK_KINDS: tuple[FallbackOn, ...] = get_args(FallbackOn)

DEFAULT_ON: tuple[FallbackOn, ...] = ("unavailable", "rate_limited")
"""``Fallback``'s default ``on``: a model that is down or rate limited."""

REFUSED_FINISH = "content_filter"
"""The finish reason of an answer the model refused to give (the providers normalize a
refusal or a content filter's stop to it)."""


def _models(value: Any) -> tuple[str, ...]:
    models = tuple(value)
    if len(models) < 2:
        raise InvalidArgument(f"Fallback needs at least two models, got {list(models)!r:.200}")
    for model in models:
        if type(model) is not str:
            raise InvalidArgument(f"Fallback: a model must be a str, got {model!r:.80}")
        provider, sep, name = model.partition("/")
        if not (provider and sep and name) or model != model.strip():
            raise InvalidArgument(f"Fallback: model must look like 'provider/name', got {model!r}")
    if len(set(models)) != len(models):
        raise InvalidArgument(f"Fallback: a model is named twice in {list(models)!r:.200}")
    return models


def _on(value: Any) -> tuple[FallbackOn, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(f"Fallback: on must be a tuple of kinds, got {value!r:.80}")
    kinds = tuple(value)
    unknown = [k for k in kinds if k not in FALLBACK_KINDS]
    if unknown or not kinds:
        raise InvalidArgument(
            f"Fallback: on must name at least one of {', '.join(FALLBACK_KINDS)},"
            f" got {list(kinds)!r:.200}"
        )
    return tuple(dict.fromkeys(kinds))


@attrs.frozen(init=False)
class Fallback:
    """Models tried in order for each model call of a run: when one fails with a kind of
    failure listed in ``on``, the next is called with the same request.

    ``on`` kinds: ``"unavailable"`` (``ProviderUnavailable``: HTTP 5xx, overload, a
    connection that failed), ``"rate_limited"`` (``RateLimited``: HTTP 429 once the
    provider's own retries are spent), ``"refused"`` (an answer whose finish reason is
    ``content_filter``: the model refused, or a content filter stopped it; the refused
    answer is discarded, its usage counted with the answer that replaces it). Any other
    failure fails the run as it would without a chain. The model that answered is
    ``Turn.model`` (None when the request's own model did).

    A fallback is decided only before anything of the turn's answer is committed: text
    streamed as live events may be followed by the next model's, but once a tool call of
    the answer started (eager dispatch) the answer is never replaced.

    Raises:
        InvalidArgument: fewer than two models, a model not of the form
            ``provider/name`` or named twice, or ``on`` not a non-empty tuple of kinds.
    """

    models: tuple[str, ...]
    on: tuple[FallbackOn, ...] = DEFAULT_ON

    def __init__(self, *models: str, on: Iterable[FallbackOn] = DEFAULT_ON) -> None:
        self.__attrs_init__(_models(models), _on(on))

    @property
    def model(self) -> str:
        """The first model of the chain (``Run.model``)."""
        return self.models[0]


def fallback_kind(failure: BaseException | None, finish_reason: str | None) -> FallbackOn | None:
    """What a model call's outcome is to a chain: ``failure`` (the exception it raised,
    None when it answered) or the answer's ``finish_reason``. None: not a kind a chain
    falls back on (an answer, or another failure)."""
    if isinstance(failure, RateLimited):
        return "rate_limited"
    if isinstance(failure, ProviderUnavailable):
        return "unavailable"
    if failure is None and finish_reason == REFUSED_FINISH:
        return "refused"
    return None


def models_after(chain: Fallback | None, model: str) -> tuple[str, ...]:
    """The models to call, in order, when ``model`` fails: the chain's models after it, or
    all but the first when ``model`` is not in the chain (a hook routed the request
    elsewhere: the chain's fallbacks still stand behind it)."""
    if chain is None:
        return ()
    if model in chain.models:
        return chain.models[chain.models.index(model) + 1 :]
    return chain.models[1:]
