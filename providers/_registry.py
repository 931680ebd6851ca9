"""Resolve the provider part of a ``provider/name`` model string."""

from __future__ import annotations

from collections.abc import Mapping

from statekernel._model import ModelProvider
from statekernel.errors import ConfigError

__all__ = ["ProviderRegistry", "builtin_provider"]

BUILTIN_NAMES = ("anthropic", "local", "ollama", "openai")


def builtin_provider(name: str) -> ModelProvider:
    """A built-in provider configured from the environment; unknown names raise ``ConfigError``.

    ``openai`` reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``, ``anthropic`` reads
    ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL``), ``ollama`` reads ``OLLAMA_HOST``;
    ``local`` runs llama.cpp in-process (extra ``statekernel[local]``).
    """
    if name == "openai":
        from statekernel.providers._openai import OpenAIProvider

        return OpenAIProvider()
    if name == "anthropic":
        from statekernel.providers._anthropic import AnthropicProvider

        return AnthropicProvider()
    if name == "ollama":
        from statekernel.providers._ollama import OllamaProvider

        return OllamaProvider()
    if name == "local":
        from statekernel.providers._local import LocalProvider

        return LocalProvider()
    raise ConfigError(f"unknown model provider {name!r} (built in: {', '.join(BUILTIN_NAMES)})")


class ProviderRegistry:
    """Providers by name: explicit ones first, then built-ins created on first use."""

    def __init__(self, providers: Mapping[str, ModelProvider] | None = None) -> None:
        self._explicit = dict(providers or {})
        self._created: dict[str, ModelProvider] = {}

    def get(self, model: str) -> ModelProvider:
        """The provider for ``model`` (``"provider/name"``)."""
        name, sep, rest = model.partition("/")
        if not sep or not name or not rest:
            raise ConfigError(f"model must look like 'provider/name', got {model!r}")
        if name in self._explicit:
            return self._explicit[name]
        if name not in self._created:
            self._created[name] = builtin_provider(name)
        return self._created[name]

    async def aclose(self) -> None:
        """Close the built-in providers this registry created (explicit ones are the caller's)."""
        created, self._created = self._created, {}
        for provider in created.values():
            await provider.aclose()
