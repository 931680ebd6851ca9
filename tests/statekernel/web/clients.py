"""Test clients of the view, addressed to ``localhost`` (a name the view answers by
default: Starlette's ``testserver`` is not one of them)."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient
from starlette.types import ASGIApp

LOCAL = "http://localhost"


def local_client(app: ASGIApp, **options: Any) -> TestClient:
    """A test client of ``app`` sending ``Host: localhost``."""
    return TestClient(app, base_url=LOCAL, **options)
