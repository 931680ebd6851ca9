"""Model providers over httpx, resolved from ``provider/name`` model strings.

Built in: ``openai`` (chat completions and every compatible server), ``anthropic``
(messages API), ``ollama`` (native ``/api/chat``) and ``local`` (llama.cpp in-process).
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
from statekernel.providers._anthropic import AnthropicProvider
from statekernel.providers._complete import complete
from statekernel.providers._http import DEFAULT_TIMEOUT, HTTPProvider, RetryPolicy
from statekernel.providers._local import LocalProvider
from statekernel.providers._ollama import OllamaProvider
from statekernel.providers._openai import OpenAIProvider
from statekernel.providers._registry import ProviderRegistry, builtin_provider

__all__ = [
    "AnthropicProvider",
    "DEFAULT_TIMEOUT",
    "Finish",
    "HTTPProvider",
    "LocalProvider",
    "ModelProvider",
    "OllamaProvider",
    "OpenAIProvider",
    "ProviderRegistry",
    "ReasoningDelta",
    "ResultBuilder",
    "RetryPolicy",
    "StreamPart",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallDone",
    "UsageUpdate",
    "assemble",
    "builtin_provider",
    "complete",
]
