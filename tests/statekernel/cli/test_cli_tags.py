"""``statekernel runs list --tag KEY=VALUE`` through the installed console script."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk_api
from statekernel.testing import ScriptedProvider

from .test_cli_runs import EXE, as_json, ok, sk

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store with runs tagged a few ways."""
    cwd = tmp_path_factory.mktemp("tags")
    store = f"sqlite:///{cwd / 'runs.db'}"

    async def make() -> None:
        providers: Any = {"scripted": ScriptedProvider([])}
        async with sk_api.Kernel(store, providers=providers) as kernel:
            given = {
                "a-prod": {"team": "a", "env": "prod"},
                "a-dev": {"team": "a", "env": "dev"},
                "b-prod": {"team": "b", "env": "prod"},
                "none": {},
            }
            for run_id, tags in given.items():
                await kernel.start(model="scripted/test", run_id=run_id, tags=tags)

    asyncio.run(make())
    return cwd, store


def test_one_tag(tagged: tuple[Path, str]) -> None:
    cwd, store = tagged
    rows = as_json(sk("runs", "list", "--store", store, "--tag", "team=a", "--json", cwd=cwd))
    assert sorted(r["run_id"] for r in rows) == ["a-dev", "a-prod"]
    assert {r["run_id"]: r["tags"] for r in rows}["a-dev"] == {"team": "a", "env": "dev"}


def test_tags_repeated_must_all_match(tagged: tuple[Path, str]) -> None:
    cwd, store = tagged
    args = ("runs", "list", "--store", store, "--tag", "team=a", "--tag", "env=prod")
    assert [r["run_id"] for r in as_json(sk(*args, "--json", cwd=cwd))] == ["a-prod"]
    table = ok(sk(*args, cwd=cwd))
    assert "tags" in table
    assert "env=prod team=a" in table
    nothing = ok(sk("runs", "list", "--store", store, "--tag", "team=z", cwd=cwd))
    assert "no runs tagged team=z" in nothing


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("team", "must look like key=value"),
        ("bad key=x", "'bad key'"),
        ("k=" + "v" * 257, "257 characters"),
    ],
)
def test_a_bad_tag_is_a_user_error(tagged: tuple[Path, str], arg: str, says: str) -> None:
    cwd, store = tagged
    done = sk("runs", "list", "--store", store, "--tag", arg, cwd=cwd)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_tag_given_twice_with_two_values_is_refused(tagged: tuple[Path, str]) -> None:
    cwd, store = tagged
    done = sk("runs", "list", "--store", store, "--tag", "k=1", "--tag", "k=2", cwd=cwd)
    assert done.returncode == 2
    assert "given twice" in done.stderr


def test_runs_show_shows_the_tags(tagged: tuple[Path, str]) -> None:
    cwd, store = tagged
    shown = ok(sk("runs", "show", "a-prod", "--store", store, cwd=cwd))
    assert "env=prod team=a" in shown
    data = as_json(sk("runs", "show", "a-prod", "--store", store, "--json", cwd=cwd))
    assert data["tags"] == {"team": "a", "env": "prod"}
