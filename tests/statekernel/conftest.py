"""Shared helpers for the core tests: a recording memory store and kernel factory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

import statekernel as sk
from statekernel.stores import Checkpoint, Lease, MemoryStore
from statekernel.testing import ScriptedProvider


class RecordingStore(MemoryStore):
    """A memory store that keeps every checkpoint it accepted, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.checkpoints: list[Checkpoint] = []

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        await super().commit(checkpoint, lease=lease)
        self.checkpoints.append(checkpoint)

    def states(self, run_id: str) -> list[str]:
        return [c.run.state for c in self.checkpoints if c.run.run_id == run_id]


MakeKernel = Callable[..., tuple[sk.Kernel, RecordingStore, ScriptedProvider]]


@pytest.fixture
def make_kernel() -> MakeKernel:
    """Build a kernel over a fresh recording store and a scripted model."""

    def make(
        script: Sequence[object], *, tools: Sequence[sk.Tool] = (), **kwargs: Any
    ) -> tuple[sk.Kernel, RecordingStore, ScriptedProvider]:
        store = RecordingStore()
        provider = ScriptedProvider(script)
        kernel = sk.Kernel(store, tools=tools, providers={"scripted": provider}, **kwargs)
        return kernel, store, provider

    return make


async def drain(kernel: sk.Kernel, run_id: str) -> list[sk.Event]:
    """Drive a run to rest and return every event it yielded."""
    return [event async for event in kernel.run(run_id)]


async def start(kernel: sk.Kernel, text: str = "hi", **kwargs: Any) -> sk.Run:
    """Start a run on the scripted model."""
    return await kernel.start(model="scripted/test", messages=[text], **kwargs)
