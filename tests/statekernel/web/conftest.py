"""Fixtures of the web view's tests: a SQLite, Redis and PostgreSQL store in turn holding
the test runs, and a test client of the view over it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from statekernel.web import create_app

from .clients import local_client
from .runs_made import make_runs
from .web_agent import kernel_options

WEB_STORE_KINDS = [
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=WEB_STORE_KINDS)
def web_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of a SQLite, Redis and PostgreSQL store in turn, holding the test runs."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/runs.db"
    else:
        url = str(request.getfixturevalue(f"{request.param}_store_url"))
    asyncio.run(make_runs(url))
    return url


@pytest.fixture
def client(web_store_url: str) -> Iterator[TestClient]:
    """A test client of the view (acting with the test agent) over ``web_store_url``."""
    with local_client(create_app(web_store_url, agent=kernel_options())) as test_client:
        yield test_client


@pytest.fixture
def reader(web_store_url: str) -> Iterator[TestClient]:
    """A test client of the read-only view (no agent) over ``web_store_url``."""
    with local_client(create_app(web_store_url)) as test_client:
        yield test_client
