"""Store methods called with arguments of the wrong type or range raise ``InvalidArgument``,
the same on every store (the conformance check, run on its own here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekernel.testing import ManualClock
from statekernel.testing._store_cases import check_bad_arguments

from .test_conformance import KINDS, factory_for


@pytest.mark.parametrize("kind", KINDS)
async def test_bad_arguments(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = factory_for(kind, tmp_path, request, ManualClock())()
    try:
        await check_bad_arguments(store)
    finally:
        await store.aclose()
