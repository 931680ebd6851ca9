"""Azure OpenAI: the chat-completions wire at a deployment's URL, with an ``api-key``
header and an ``api-version`` query parameter."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from statekernel._records.messages import ModelRequest
from statekernel.errors import ConfigError
from statekernel.providers._keys import api_key as provider_key
from statekernel.providers._openai import OpenAIProvider

__all__ = ["DEFAULT_API_VERSION", "AzureOpenAIProvider"]

DEFAULT_API_VERSION = "2024-10-21"
"""The generally available API version used when none is configured."""


class AzureOpenAIProvider(OpenAIProvider):
    """The ``azure`` provider: ``azure/<deployment>`` posts to
    ``{endpoint}/openai/deployments/<deployment>/chat/completions?api-version=...``.

    ``endpoint`` (``https://<resource>.openai.azure.com``), ``api_key`` and
    ``api_version`` default to ``AZURE_OPENAI_ENDPOINT``, ``AZURE_OPENAI_API_KEY`` and
    ``AZURE_OPENAI_API_VERSION`` (then ``OPENAI_API_VERSION``, then
    ``DEFAULT_API_VERSION``). The key goes in the ``api-key`` header.
    """

    name = "azure"

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        api_key: str | None = None,
        api_version: str | None = None,
        **kwargs: Any,
    ) -> None:
        endpoint = endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        if not endpoint:
            raise ConfigError("the azure provider needs AZURE_OPENAI_ENDPOINT (or endpoint=...)")
        key = provider_key(api_key, "AZURE_OPENAI_API_KEY")
        if not key:
            raise ConfigError("the azure provider needs AZURE_OPENAI_API_KEY (or api_key=...)")
        kwargs.setdefault("max_tokens_field", "max_completion_tokens")
        super().__init__(api_key="", base_url=f"{endpoint.rstrip('/')}/openai", **kwargs)
        self._azure_key = key
        self.api_version = (
            api_version
            or os.environ.get("AZURE_OPENAI_API_VERSION")
            or os.environ.get("OPENAI_API_VERSION")
            or DEFAULT_API_VERSION
        )

    def _secrets(self) -> Iterable[str]:
        return (self._azure_key,)

    def _endpoint(self, request: ModelRequest, streaming: bool) -> str:
        deployment = quote(request.model_name, safe="")
        return (
            f"{self.base_url}/deployments/{deployment}/chat/completions"
            f"?api-version={quote(self.api_version, safe='')}"
        )

    def _headers(self) -> dict[str, str]:
        return {**super()._headers(), "api-key": self._azure_key}
