"""Providers of other distributions: a provider registered in the entry point group
``statekernel.providers`` serves the model strings that start with its name."""

from __future__ import annotations

from pathlib import Path

import pytest

import statekernel
from statekernel.errors import ConfigError
from statekernel.providers import ProviderRegistry, builtin_provider

from ..distributions import install

PROVIDER = '''
from statekernel.providers import ScriptedProvider


def corp() -> ScriptedProvider:
    """The provider of another distribution: made with no arguments."""
    return ScriptedProvider(["Hello from corp."])


def failing() -> ScriptedProvider:
    raise KeyError("CORP_API_KEY")


def wrong() -> object:
    return "not a provider"
'''


@pytest.fixture
def corp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(
        tmp_path / "site",
        monkeypatch,
        "statekernel-corp",
        {
            "statekernel.providers": {
                "corp": "sk_corp:corp",
                "openai": "sk_corp:corp",
                "failing": "sk_corp:failing",
                "wrong": "sk_corp:wrong",
            }
        },
        {"sk_corp": PROVIDER},
    )


@pytest.mark.usefixtures("corp")
async def test_a_registered_provider_serves_its_models() -> None:
    async with statekernel.Kernel("memory://") as kernel:
        run = await kernel.start(model="corp/large", messages=["Hi"])
        async for _ in kernel.run(run.run_id):
            pass
        assert (await kernel.get(run.run_id)).output == "Hello from corp."


@pytest.mark.usefixtures("corp")
def test_a_registered_provider_never_replaces_a_built_in_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    from statekernel.providers import OpenAIProvider, ScriptedProvider

    assert isinstance(builtin_provider("corp"), ScriptedProvider)
    assert isinstance(builtin_provider("openai"), OpenAIProvider)


@pytest.mark.usefixtures("corp")
def test_an_unknown_provider_names_the_installed_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"installed: corp, failing, openai, wrong;.*statekernel.providers"
    ):
        ProviderRegistry().check("nope/model")


def test_without_the_distribution_the_provider_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown model provider 'corp'"):
        ProviderRegistry().check("corp/large")


@pytest.mark.usefixtures("corp")
def test_a_registered_factory_that_fails_or_makes_no_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'failing' failed to make its ModelProvider: KeyError"):
        builtin_provider("failing")
    with pytest.raises(ConfigError, match=r"'wrong' made a str, not a ModelProvider"):
        builtin_provider("wrong")


@pytest.mark.usefixtures("corp")
def test_a_name_two_distributions_register_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # which one served "corp/..." depended on the order of sys.path, silently
    install(
        tmp_path / "rival",
        monkeypatch,
        "statekernel-rival",
        {"statekernel.providers": {"Corp": "sk_rival:corp"}},
        {"sk_rival": PROVIDER},
    )
    with pytest.raises(ConfigError, match=r"'corp' is registered by more than one") as info:
        builtin_provider("corp")
    assert "statekernel-corp (sk_corp:corp)" in str(info.value)
    assert "statekernel-rival (sk_rival:corp)" in str(info.value)
