"""Model providers over httpx, resolved from ``provider/name`` model strings.

Built in: ``openai`` (chat completions and every compatible server), ``anthropic``
(messages API) and ``ollama`` (native ``/api/chat``).
"""

from __future__ import annotations

from statekernel._model import (
    Finish,
    ModelProvider,
    ReasoningDelta,
    ResultBuilder,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
    assemble,
)
from statekernel.providers._registry import ProviderRegistry, builtin_provider

__all__ = [
    "Finish",
    "ModelProvider",
    "ProviderRegistry",
    "ReasoningDelta",
    "ResultBuilder",
    "StreamPart",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallDone",
    "UsageUpdate",
    "assemble",
    "builtin_provider",
]
