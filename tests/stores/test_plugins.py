"""Stores of other distributions: a URL scheme registered in the entry point group
``statekernel.stores`` opens through ``open_store``, ``Kernel`` and the command line."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import statekernel
from statekernel.errors import ConfigError
from statekernel.providers import ScriptedProvider
from statekernel.stores import MemoryStore, open_store

from ..distributions import install

STORE = '''
from statekernel.stores import MemoryStore

OPENED = []


class VaultStore(MemoryStore):
    """A store of another distribution (a memory store named by its URL)."""

    def __init__(self, url: str) -> None:
        super().__init__(url.split("://", 1)[1])
        OPENED.append(url)


def failing(url: str) -> VaultStore:
    raise OSError(f"cannot reach {url}")


def wrong(url: str) -> object:
    return {"url": url}
'''


@pytest.fixture
def vault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(
        tmp_path / "site",
        monkeypatch,
        "statekernel-vault",
        {
            "statekernel.stores": {
                "vault": "sk_vault:VaultStore",
                "broken": "sk_missing:Store",
                "failing": "sk_vault:failing",
                "wrong": "sk_vault:wrong",
            }
        },
        {"sk_vault": STORE},
    )


@pytest.mark.usefixtures("vault")
async def test_a_registered_scheme_opens_the_distributions_store() -> None:
    sk_vault = importlib.import_module("sk_vault")

    store = open_store("vault://runs")
    assert isinstance(store, sk_vault.VaultStore)
    assert isinstance(store, MemoryStore)
    assert sk_vault.OPENED == ["vault://runs"]
    provider = ScriptedProvider(["Hello."])
    async with statekernel.Kernel("vault://kernel", providers={"scripted": provider}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Hi"])
        async for _ in kernel.run(run.run_id):
            pass
        assert (await kernel.get(run.run_id)).output == "Hello."
    await store.aclose()


@pytest.mark.usefixtures("vault")
def test_a_registered_store_that_cannot_load_names_its_distribution() -> None:
    with pytest.raises(ConfigError, match=r"'broken' of statekernel-vault .*sk_missing"):
        open_store("broken://x")


@pytest.mark.usefixtures("vault")
def test_an_unknown_scheme_names_the_registered_ones_and_the_group() -> None:
    with pytest.raises(ConfigError, match=r"unknown store URL scheme 'nope'.*vault.*"):
        open_store("nope://x")
    with pytest.raises(ConfigError, match=r"statekernel\.stores"):
        open_store("nope://x")


def test_without_the_distribution_the_scheme_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown store URL scheme 'vault'"):
        open_store("vault://runs")


@pytest.mark.usefixtures("vault")
def test_a_registered_factory_that_fails_or_makes_no_store_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'failing' failed to make its CheckpointStore: OSError"):
        open_store("failing://x")
    with pytest.raises(ConfigError, match=r"'wrong' made a dict, not a CheckpointStore"):
        open_store("wrong://x")
