"""CSRF protection: every state-changing request carries a token the view signed.

A page gives the browser a cookie holding a random nonce signed with the app's secret
(HMAC), and puts the same token in the address every form posts to (its query string,
so the token is checked before the body is read); a POST is taken only when the token
it carries (that query parameter, or the ``X-CSRF-Token`` header) equals the cookie's
and the signature holds (another site can neither read the cookie nor forge a signed
one). The secret is drawn anew for each app unless ``STATEKERNEL_UI_SECRET`` gives it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "FIELD", "HEADER", "SECRET_VARIABLE", "Csrf", "sent_token"]

COOKIE = "statekernel_csrf"
SECRET_VARIABLE = "STATEKERNEL_UI_SECRET"
"""The environment variable whose value signs the tokens when set: several processes
(``uvicorn --workers``, replicas) serving one view must share it."""
FIELD = "csrf_token"
"""The query parameter carrying the token."""
HEADER = "X-CSRF-Token"
"""The header carrying the token (for a client posting other than from the pages)."""


def sent_token(request: Request) -> str | None:
    """The token ``request`` carries where it can be read before its body: the
    ``X-CSRF-Token`` header, else the ``csrf_token`` query parameter."""
    return request.headers.get(HEADER) or request.query_params.get(FIELD)


class Csrf:
    """Issues and checks the view's CSRF tokens."""

    def __init__(self, secret: bytes | None = None) -> None:
        if secret is None:  # processes serving one view share it through the environment
            shared = os.environ.get(SECRET_VARIABLE, "")
            secret = shared.encode() if shared else None
        self._secret = secret or secrets.token_bytes(32)

    def signature(self, purpose: str, text: str) -> str:
        """The HMAC of ``text`` under the view's secret for ``purpose`` (``csrf`` for
        the tokens, ``note`` for the notes of the actions: one cannot stand for the
        other)."""
        message = f"{purpose}\0{text}".encode(errors="surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def _sign(self, nonce: str) -> str:
        return self.signature("csrf", nonce)

    def _valid(self, token: str) -> bool:
        nonce, _, signature = token.partition(".")
        # bytes: a cookie holding non-ASCII text is refused, not an error
        expected = self._sign(nonce).encode()
        return bool(nonce) and hmac.compare_digest(signature.encode(), expected)

    def token(self, request: Request) -> str:
        """The request's token: its cookie's when valid, else a new one (``remember``
        sets it on the response)."""
        cached = getattr(request.state, "csrf_token", None)
        if isinstance(cached, str):
            return cached
        token = request.cookies.get(COOKIE, "")
        if not self._valid(token):
            nonce = secrets.token_urlsafe(24)
            token = f"{nonce}.{self._sign(nonce)}"
        request.state.csrf_token = token
        return token

    def remember(self, request: Request, response: Response) -> None:
        """Set the cookie of the token a page handed out (when it is new)."""
        token = getattr(request.state, "csrf_token", None)
        if isinstance(token, str) and request.cookies.get(COOKIE) != token:
            path = request.scope.get("root_path") or "/"
            response.set_cookie(
                COOKIE, token, httponly=True, samesite="strict", path=path.rstrip("/") or "/"
            )

    def check(self, request: Request, sent: object) -> bool:
        """Whether ``sent`` (the token the request carries) matches the request's signed
        cookie."""
        cookie = request.cookies.get(COOKIE, "")
        return (
            isinstance(sent, str)
            and self._valid(cookie)
            and hmac.compare_digest(sent.encode(), cookie.encode())
        )
