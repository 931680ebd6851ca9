"""Resolve the provider part of a ``provider/name`` model string."""

from __future__ import annotations

import os
from collections.abc import Mapping

from statekernel._storage.provider import ModelProvider
from statekernel.errors import ConfigError
from statekernel.providers._keys import api_key as provider_key

__all__ = ["NATIVE_NAMES", "ProviderRegistry", "builtin_names", "builtin_provider"]

NATIVE_NAMES = ("anthropic", "azure", "local", "ollama", "openai")
"""Providers with a module of their own (the others are rows of ``VENDORS``)."""


def builtin_names() -> tuple[str, ...]:
    """Every built-in provider name a model string may start with, aliases included."""
    from statekernel.providers._vendors import ALIASES, VENDORS

    return tuple(sorted({*NATIVE_NAMES, *VENDORS, *ALIASES}))


def builtin_provider(name: str) -> ModelProvider:
    """A built-in provider configured from the environment; unknown names raise ``ConfigError``.

    ``openai`` reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``, ``anthropic`` reads
    ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL``), ``ollama`` reads ``OLLAMA_HOST``,
    ``azure`` reads ``AZURE_OPENAI_ENDPOINT``, ``AZURE_OPENAI_API_KEY`` and
    ``AZURE_OPENAI_API_VERSION``; ``local`` runs llama.cpp in-process (extra
    ``statekernel[local]``). The OpenAI-compatible vendors (``groq``, ``mistral``,
    ``vllm`` ...) read the key variable of their row in ``VENDORS`` and
    ``<NAME>_BASE_URL``.
    """
    if name == "openai":
        from statekernel.providers._openai import OpenAIProvider

        return OpenAIProvider()
    if name == "anthropic":
        from statekernel.providers._anthropic import AnthropicProvider

        return AnthropicProvider()
    if name == "azure":
        from statekernel.providers._azure import AzureOpenAIProvider

        return AzureOpenAIProvider()
    if name == "ollama":
        from statekernel.providers._ollama import OllamaProvider

        return OllamaProvider()
    if name == "local":
        from statekernel.providers._local import LocalProvider

        return LocalProvider()
    return _vendor_provider(name)


def _vendor_provider(name: str) -> ModelProvider:
    from statekernel.providers._openai import OpenAIProvider
    from statekernel.providers._vendors import ALIASES, VENDORS

    vendor = VENDORS.get(ALIASES.get(name, name))
    if vendor is None:
        known = ", ".join(builtin_names())
        raise ConfigError(
            f"unknown model provider {name!r} (built in: {known}; or pass your own with"
            " Kernel(providers={...}))"
        )
    key = provider_key(None, vendor.key_env)
    if vendor.needs_key and not key:
        raise ConfigError(f"the {vendor.name} provider needs {vendor.key_env}")
    provider = OpenAIProvider(
        name=vendor.name,
        api_key=key or "",
        base_url=os.environ.get(vendor.url_env) or vendor.base_url,
        stream_usage=vendor.stream_usage,
        think_tags=vendor.think_tags,
        short_call_ids=vendor.short_call_ids,
    )
    provider.url_variable = vendor.url_env
    return provider


class ProviderRegistry:
    """Providers by name: explicit ones first, then built-ins created on first use."""

    def __init__(self, providers: Mapping[str, ModelProvider] | None = None) -> None:
        self._explicit = dict(providers or {})
        self._created: dict[str, ModelProvider] = {}

    def get(self, model: str) -> ModelProvider:
        """The provider for ``model`` (``"provider/name"``)."""
        name = self.check(model)
        if name in self._explicit:
            return self._explicit[name]
        if name not in self._created:
            self._created[name] = builtin_provider(name)
        return self._created[name]

    def check(self, model: str) -> str:
        """The provider name of ``model`` if this registry can serve it (without creating
        the provider); else ``ConfigError`` naming the providers it knows."""
        name, sep, rest = model.partition("/")
        if not sep or not name or not rest:
            raise ConfigError(f"model must look like 'provider/name', got {model!r}")
        if name in self._explicit or name in builtin_names():
            return name
        given = ", ".join(sorted(self._explicit))
        raise ConfigError(
            f"unknown model provider {name!r} in {model!r} ("
            + (f"this kernel's: {given}; " if given else "")
            + f"built in: {', '.join(builtin_names())}; or pass your own with"
            " Kernel(providers={...}))"
        )

    def shared(self) -> ProviderRegistry:
        """A registry that resolves through this one and closes nothing (for a kernel
        that borrows another's providers, as a child run's does)."""
        return _Borrowed(self)

    async def aclose(self) -> None:
        """Close the built-in providers this registry created (explicit ones are the caller's)."""
        created, self._created = self._created, {}
        for provider in created.values():
            await provider.aclose()


class _Borrowed(ProviderRegistry):
    def __init__(self, owner: ProviderRegistry) -> None:
        super().__init__()
        self._owner = owner

    def get(self, model: str) -> ModelProvider:
        return self._owner.get(model)

    def check(self, model: str) -> str:
        return self._owner.check(model)

    async def aclose(self) -> None:
        """Nothing to close: the providers are the owner's."""
