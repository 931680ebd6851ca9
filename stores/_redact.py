"""``redact_url(url)``: a store URL safe to print or log."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]

_USERINFO = re.compile(r"(//[^/?#@:]*):[^/?#@]*@")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, safe to print or log (also when
    the URL is malformed)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a malformed host or port: cut the password out of the text
        return _USERINFO.sub(r"\1:***@", url, count=1)
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
