"""Loads leave the garbage collector alone: it stays on while a run is decoded."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from statekernel.stores import open_store
from statekernel.stores._format.codec import _Decoder
from statekernel.testing._store_cases import commit_chain, sample_run

KINDS = ["file", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.mark.parametrize("kind", KINDS)
async def test_collector_stays_on_while_a_load_decodes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = {
        "file": f"file://{tmp_path}/files",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
    }.get(kind) or request.getfixturevalue("redis_store_url")
    store = open_store(url)
    chain = await commit_chain(store, sample_run("r"), 5)
    seen: list[bool] = []
    message, turn = _Decoder.message_at, _Decoder._turn

    def watched_message(self: _Decoder, pos: int) -> Any:
        seen.append(gc.isenabled())
        return message(self, pos)

    def watched_turn(self: _Decoder, doc: Any, version: int, what: str) -> Any:
        seen.append(gc.isenabled())
        return turn(self, doc, version, what)

    monkeypatch.setattr(_Decoder, "message_at", watched_message)
    monkeypatch.setattr(_Decoder, "_turn", watched_turn)
    fresh = open_store(url)  # nothing remembered: the load decodes everything
    loaded = await fresh.load("r")
    assert loaded == chain[-1]
    assert list(loaded.turns) == list(chain[-1].turns)
    assert seen, "the load decoded no message"
    assert all(seen), "the collector was off while a load decoded"
    assert gc.isenabled()
    await fresh.aclose()
    await store.aclose()
