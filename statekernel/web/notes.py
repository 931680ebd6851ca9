"""The notes of the actions: what an action did, shown on the page it redirects to.

The note travels in the redirect's query string with the view's signature of it; a
page shows a note only when the signature holds, so a link made elsewhere cannot put
its own words on the view's pages.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlencode

from starlette.requests import Request

from statekernel.web.security import Csrf

__all__ = ["NOTE", "SIGNATURE", "issued_note", "note_query"]

NOTE = "note"
SIGNATURE = "note_sig"


def note_query(csrf: Csrf, text: str) -> str:
    """The query string carrying ``text`` as a note the view issued."""
    return urlencode({NOTE: text, SIGNATURE: csrf.signature(NOTE, text)})


def issued_note(csrf: Csrf, request: Request) -> str:
    """The note of ``request``'s query when the view issued it, else ``""``."""
    text = request.query_params.get(NOTE, "")
    sent = request.query_params.get(SIGNATURE, "")
    if not text or not sent.isascii():
        return ""
    return text if hmac.compare_digest(sent, csrf.signature(NOTE, text)) else ""
