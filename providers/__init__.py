"""Model providers over httpx, resolved from ``provider/name`` model strings.

Built in: ``openai`` (chat completions and every compatible server),
``openai-responses`` (OpenAI's Responses API), ``azure`` (the
same wire at a deployment URL), ``anthropic`` (messages API), ``ollama`` (native
``/api/chat``), ``local`` (llama.cpp in-process), and the OpenAI-compatible vendors of
``VENDORS`` (``groq``, ``mistral``, ``google``, ``vllm`` ...). ``ScriptedProvider``
answers from a script of ``Reply`` objects, for demos, tests and benchmarks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekernel import _exports
from statekernel._storage.provider import (
    ModelProvider,
    ReasoningDelta,
    ResultBuilder,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
    assemble,
)
from statekernel.providers._registry import ProviderRegistry, builtin_names, builtin_provider

if TYPE_CHECKING:
    from statekernel.providers._anthropic import AnthropicProvider
    from statekernel.providers._azure import AzureOpenAIProvider
    from statekernel.providers._complete import complete
    from statekernel.providers._http import DEFAULT_TIMEOUT, HTTPProvider, RetryPolicy
    from statekernel.providers._local import LocalProvider
    from statekernel.providers._ollama import OllamaProvider
    from statekernel.providers._openai import OpenAIProvider
    from statekernel.providers._responses import OpenAIResponsesProvider
    from statekernel.providers._scripted import Reply, ScriptedProvider
    from statekernel.providers._vendors import VENDORS, Vendor

__getattr__, __dir__ = _exports.lazy_exports(
    __name__,
    {
        "AnthropicProvider": "._anthropic",
        "AzureOpenAIProvider": "._azure",
        "DEFAULT_TIMEOUT": "._http",
        "HTTPProvider": "._http",
        "LocalProvider": "._local",
        "OllamaProvider": "._ollama",
        "OpenAIProvider": "._openai",
        "OpenAIResponsesProvider": "._responses",
        "Reply": "._scripted",
        "RetryPolicy": "._http",
        "ScriptedProvider": "._scripted",
        "VENDORS": "._vendors",
        "Vendor": "._vendors",
        "complete": "._complete",
    },
)

__all__ = [
    "AnthropicProvider",
    "AzureOpenAIProvider",
    "DEFAULT_TIMEOUT",
    "HTTPProvider",
    "LocalProvider",
    "ModelProvider",
    "OllamaProvider",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "ProviderRegistry",
    "ReasoningDelta",
    "Reply",
    "ResultBuilder",
    "RetryPolicy",
    "ScriptedProvider",
    "StreamEnd",
    "StreamPart",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallDone",
    "UsageUpdate",
    "VENDORS",
    "Vendor",
    "assemble",
    "builtin_names",
    "builtin_provider",
    "complete",
]
