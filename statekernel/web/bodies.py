"""Request bodies: bounded before a byte is read, and read only once a request has
shown it may act.

``BodyLimit`` answers 413 to a request whose ``Content-Length`` is over
``MAX_BODY`` without reading its body (and closes the connection: the server reads
none of it), and stops one without a length (chunked) once it has sent more; a
response to a chunked body sent before its end also closes the connection (the server
would otherwise read the rest, however long, to throw it away).
``read_form`` reads an action's form with tight limits (no files, ``MAX_FIELDS``
fields), once the action has checked its CSRF token and the ``authorize`` hook.
"""

from __future__ import annotations

from starlette.datastructures import FormData, Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from statekernel.web.numbers import BadNumber, whole_number

__all__ = ["MAX_BODY", "MAX_FIELDS", "BodyLimit", "read_form"]

MAX_BODY = 256 * 1024
"""Bytes a request body may have: an answer, a message or a tool's output typed in."""

MAX_FIELDS = 200
"""Fields a form may have (an answer form has one per property of the question)."""

TOO_LARGE = f"the request body is over {MAX_BODY} bytes"
CLOSE = {"Connection": "close"}
"""Refusing a body too large, the server closes the connection rather than read it."""


class BodyLimit:
    """ASGI middleware bounding the body of every HTTP request to ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a body declared too large at once; pass the request on with a
        ``receive`` that stops one growing too large."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        try:
            length = None if declared is None else whole_number(declared, "Content-Length")
        except BadNumber as exc:
            await PlainTextResponse(str(exc), 400, CLOSE)(scope, receive, send)
            return
        if length is not None and length > self.limit:
            await PlainTextResponse(TOO_LARGE, 413, CLOSE)(scope, receive, send)
            return
        read = 0
        unread = length is None and "transfer-encoding" in headers  # chunked, endless

        async def bounded() -> Message:
            nonlocal read, unread
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                unread = unread and message.get("more_body", False)
                if read > self.limit:
                    raise HTTPException(413, TOO_LARGE, headers=CLOSE)
            return message

        async def closing_early(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                # answered before the end of a body of no length: read no more of it
                MutableHeaders(scope=message).update(CLOSE)
            await send(message)

        await self.app(scope, bounded, closing_early)


async def read_form(request: Request) -> FormData:
    """The request's form (URL-encoded or multipart), with no file and at most
    ``MAX_FIELDS`` fields; its size is ``BodyLimit``'s to bound.

    Raises:
        HTTPException: 400 for a form over those limits or malformed, 413 for a body
            over ``MAX_BODY``.
    """
    form = await request.form(max_files=0, max_fields=MAX_FIELDS)
    # counted again: Starlette before 0.40 bounds the fields of multipart forms only
    if len(form.multi_items()) > MAX_FIELDS:
        raise HTTPException(400, f"Too many fields. Maximum number of fields is {MAX_FIELDS}.")
    return form
