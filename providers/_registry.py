"""Resolve the provider part of a ``provider/name`` model string."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from statekernel._storage.plugins import (
    PROVIDER_GROUP,
    load_registered,
    make_registered,
    registered,
)
from statekernel._storage.provider import ModelProvider
from statekernel.errors import ConfigError
from statekernel.providers._keys import api_key as provider_key

__all__ = ["NATIVE_NAMES", "ProviderRegistry", "builtin_names", "builtin_provider"]

_NATIVE: dict[str, tuple[str, str]] = {
    "anthropic": ("statekernel.providers._anthropic", "AnthropicProvider"),
    "azure": ("statekernel.providers._azure", "AzureOpenAIProvider"),
    "local": ("statekernel.providers._local", "LocalProvider"),
    "ollama": ("statekernel.providers._ollama", "OllamaProvider"),
    "openai": ("statekernel.providers._openai", "OpenAIProvider"),
    "openai-responses": ("statekernel.providers._responses", "OpenAIResponsesProvider"),
}
"""Providers with a module of their own: name -> (module, class), made with no arguments."""

NATIVE_NAMES = tuple(_NATIVE)
"""Providers with a module of their own (the others are rows of ``VENDORS``)."""


def builtin_names() -> tuple[str, ...]:
    """Every built-in provider name a model string may start with, aliases included.

    Returns:
        The names, sorted (providers registered by other distributions are not among
            them).
    """
    from statekernel.providers._vendors import ALIASES, VENDORS

    return tuple(sorted({*NATIVE_NAMES, *VENDORS, *ALIASES}))


def builtin_provider(name: str) -> ModelProvider:
    """A built-in provider configured from the environment, else one an installed
    distribution registers in the entry point group ``statekernel.providers`` (made with
    no arguments); unknown names raise ``ConfigError``.

    ``openai`` and ``openai-responses`` read ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``,
    ``anthropic`` reads
    ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL``), ``ollama`` reads ``OLLAMA_HOST``,
    ``azure`` reads ``AZURE_OPENAI_ENDPOINT``, ``AZURE_OPENAI_API_KEY`` and
    ``AZURE_OPENAI_API_VERSION``; ``local`` runs llama.cpp in-process (extra
    ``statekernel[local]``). The OpenAI-compatible vendors (``groq``, ``mistral``,
    ``vllm`` ...) read the key variable of their row in ``VENDORS`` and
    ``<NAME>_BASE_URL``.

    Returns:
        A new provider (each call makes another).

    Raises:
        ConfigError: ``name`` is neither built in nor registered, the provider's
            environment lacks what it needs (an API key, an endpoint), or a registered
            factory is not callable, raises, or returns no provider.
    """
    native = _NATIVE.get(name)
    if native is not None:
        module, cls = native
        made: ModelProvider = getattr(importlib.import_module(module), cls)()
        return made
    from statekernel.providers._vendors import ALIASES, VENDORS

    if ALIASES.get(name, name) in VENDORS:
        return _vendor_provider(name)
    factory = load_registered(PROVIDER_GROUP, name)
    if factory is None:
        known = ", ".join(builtin_names())
        raise ConfigError(
            f"unknown model provider {name!r} (built in: {known}; or pass your own with"
            f" Kernel(providers={{...}}), or register it in the entry point group"
            f" {PROVIDER_GROUP!r})"
        )
    if not callable(factory):
        raise ConfigError(f"the {PROVIDER_GROUP} entry point {name!r} is not callable")
    provider: ModelProvider = make_registered(PROVIDER_GROUP, name, factory, (), ModelProvider)
    return provider


def _vendor_provider(name: str) -> ModelProvider:
    from statekernel.providers._openai import OpenAIProvider
    from statekernel.providers._vendors import ALIASES, VENDORS

    vendor = VENDORS[ALIASES.get(name, name)]
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
        """The provider for ``model`` (``"provider/name"``).

        Returns:
            The explicit provider of that name, else the built-in (or registered) one,
                created on first use and kept.

        Raises:
            ConfigError: ``model`` is not ``provider/name``, its provider is unknown, or
                the built-in provider cannot be made (see ``builtin_provider``).
        """
        name = self.check(model)
        if name in self._explicit:
            return self._explicit[name]
        if name not in self._created:
            self._created[name] = builtin_provider(name)
        return self._created[name]

    def check(self, model: str) -> str:
        """The provider name of ``model`` if this registry can serve it (without creating
        the provider); else ``ConfigError`` naming the providers it knows.

        Returns:
            The provider part of ``model``.

        Raises:
            ConfigError: ``model`` is not ``provider/name``, or this registry knows no
                provider of that name.
        """
        name, sep, rest = model.partition("/")
        if not sep or not name or not rest:
            raise ConfigError(f"model must look like 'provider/name', got {model!r}")
        if name in self._explicit or name in builtin_names():
            return name
        installed = registered(PROVIDER_GROUP)
        if name.lower() in installed:
            return name
        given = ", ".join(sorted(self._explicit))
        others = ", ".join(sorted(installed))
        raise ConfigError(
            f"unknown model provider {name!r} in {model!r} ("
            + (f"this kernel's: {given}; " if given else "")
            + f"built in: {', '.join(builtin_names())}; "
            + (f"installed: {others}; " if others else "")
            + "or pass your own with Kernel(providers={...}), or register it in the"
            f" entry point group {PROVIDER_GROUP!r})"
        )

    def shared(self) -> ProviderRegistry:
        """A registry that resolves through this one and closes nothing (for a kernel
        that borrows another's providers, as a child run's does).

        Returns:
            The borrowing registry; its ``aclose`` closes nothing.
        """
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
