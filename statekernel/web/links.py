"""The view's links: paths from the root of the site (with the path the view is mounted
at), never absolute URLs built from the request's ``Host`` header."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

__all__ = ["path_for"]


def path_for(request: Request, name: str, /, **params: Any) -> str:
    """The path of the view's route ``name`` (``url_for`` of the templates)."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return root + str(request.app.url_path_for(name, **params))
