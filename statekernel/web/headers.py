"""The headers every response of the view carries: it cannot be framed by another page
(clickjacking), loads scripts, styles and images from itself only (the templates hold
no inline script or style), is never sniffed as another type, and names none of its
addresses to other sites."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_SECURITY_POLICY", "SECURITY_HEADERS", "SecurityHeaders"]

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
    "object-src 'none'"
)
"""The policy of every response that does not set a stricter one of its own."""

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
"""Set on every response (replacing a value the response had)."""


class SecurityHeaders:
    """ASGI middleware: every HTTP response of ``app`` gets ``SECURITY_HEADERS``, and
    ``CONTENT_SECURITY_POLICY`` unless it has a policy (which must then forbid framing
    itself)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run ``app`` with the headers added to its response."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            await send(message)

        await self.app(scope, receive, with_headers)
