"""CSRF tokens: signed by the view's secret, shared by every process that serves it."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from statekernel.web.security import COOKIE, SECRET_VARIABLE, Csrf


def _app(csrf: Csrf) -> Starlette:
    async def page(request: Request) -> PlainTextResponse:
        response = PlainTextResponse(csrf.token(request))
        csrf.remember(request, response)
        return response

    async def post(request: Request) -> PlainTextResponse:
        form = await request.form()
        ok = csrf.check(request, form.get("csrf_token"))
        return PlainTextResponse("ok" if ok else "refused", status_code=200 if ok else 403)

    return Starlette(routes=[Route("/", page), Route("/act", post, methods=["POST"])])


def test_processes_sharing_the_secret_accept_each_others_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_VARIABLE, "one secret for every worker")
    first, second = TestClient(_app(Csrf())), TestClient(_app(Csrf()))
    token = first.get("/").text
    second.cookies.set(COOKIE, token)
    assert second.post("/act", data={"csrf_token": token}).status_code == 200
    monkeypatch.delenv(SECRET_VARIABLE)
    third = TestClient(_app(Csrf()))
    third.cookies.set(COOKIE, token)
    assert third.post("/act", data={"csrf_token": token}).status_code == 403


def test_a_cookie_of_any_text_is_refused_not_an_error() -> None:
    client = TestClient(_app(Csrf()))
    cookie = {b"cookie": f"{COOKIE}=a.\u00e9\u00e9".encode()}  # as a browser may send it
    assert client.get("/", headers=cookie).status_code == 200, "a new token instead"
    sent = {"csrf_token": "a.x"}
    assert client.post("/act", data=sent, headers=cookie).status_code == 403
