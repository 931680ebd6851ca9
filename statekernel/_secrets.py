"""Redaction: the one function every text statekernel prints, logs, stores, raises, puts
in a span or hands to a model passes through where it may carry a secret.

``redact(text)`` hides, wherever they appear in ``text``:

* the password of a URL's userinfo (``redis://user:***@host``), or the whole userinfo
  when it has no password (``https://***@host``: a token used as the user name);
* the values of URL query parameters whose names look secret (``password``, ``token``,
  ``key``, ``secret``, ``auth``, ``sig``, ``credential``, ``session``, ``cookie``);
* the values of credential headers (``Authorization: Bearer ***``, ``x-api-key: ***``,
  ``api-key``, ``cookie``, ...) and any ``Bearer``/``Basic`` token;
* every secret handed to statekernel's configuration (``remember``: provider API keys,
  passwords and secret parameters of store and MCP URLs, MCP credential headers and
  environment values), in every form it takes in text: as given, stripped, JSON- or
  ``repr``-escaped, URL-quoted, as the ``repr`` of its bytes.

Where it is applied: store, provider and MCP errors when they are built; every failure
message, tool error and cut-off reason when it is committed (the lifecycle's
transitions); span statuses and exception events; statekernel's own log records
(``logger``); every line the command line prints.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from urllib.parse import quote, quote_plus, unquote, urlsplit

__all__ = [
    "MASK",
    "THIRD_PARTY_LOGGERS",
    "logger",
    "redact",
    "redact_url",
    "remember",
    "remember_secret_values",
    "remember_url",
    "secret_name",
]

MASK = "***"
_MIN = 4
"""Shorter values are not remembered: masking them would garble ordinary text."""

_SECRET_WORD = r"pass|pwd|token|key|secret|auth|sig|credential|session|cookie|private"
_SECRET_NAME = re.compile(rf"(?:{_SECRET_WORD})", re.IGNORECASE)
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/?#\s]*)@")
_QUERY = re.compile(
    rf"(?P<head>[?&;][^=&?#;\s'\"<>]*(?:{_SECRET_WORD})[^=&?#;\s'\"<>]*=)"
    r"(?P<value>[^&#;\s'\"<>)\]]+)",
    re.IGNORECASE,
)
_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?(?:authorization|x-api-key|api-key|x-goog-api-key|"
    r"x-auth-token|cookie|set-cookie)['\"]?\s*[:=]\s*['\"]?"
    r"(?:(?:bearer|basic|token)\s+)?)(?P<value>[^\s'\",;}]+)",
    re.IGNORECASE,
)
_SCHEME_TOKEN = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)(?P<value>[A-Za-z0-9._~+/=-]{4,})")

_lock = threading.Lock()
_known: set[str] = set()
_forms: tuple[str, ...] = ()
"""Every form of every remembered secret, longest first."""


def secret_name(name: str) -> bool:
    """True when a parameter, header or variable named ``name`` looks like a secret."""
    return _SECRET_NAME.search(name) is not None


def _forms_of(secret: str) -> set[str]:
    found = set()
    for value in {secret, secret.strip()}:
        found |= {
            value,
            json.dumps(value)[1:-1],
            json.dumps(value, ensure_ascii=False)[1:-1],
            repr(value)[1:-1],
            repr(value.encode("utf-8", "backslashreplace"))[2:-1],
            quote(value, safe=""),
            quote_plus(value, safe=""),
        }
    return {f for f in found if len(f) >= _MIN and f != MASK}


def remember(secret: str | None) -> None:
    """Hide ``secret`` (in every form) from everything ``redact`` sees from now on."""
    global _forms
    if not isinstance(secret, str) or len(secret.strip()) < _MIN:
        return
    with _lock:
        if secret in _known:
            return
        _known.add(secret)
        forms = set(_forms) | _forms_of(secret)
        _forms = tuple(sorted(forms, key=len, reverse=True))


def remember_url(url: str) -> None:
    """Remember the password (or token user name) and the secret query values of ``url``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    info = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    user, _, password = info.partition(":")
    remember(unquote(password) if password else unquote(user) if info else None)
    for pair in re.split(r"[&;]", parts.query):
        name, _, value = pair.partition("=")
        if value and secret_name(name):
            remember(unquote(value))


def remember_secret_values(values: Mapping[str, str]) -> None:
    """Remember the values whose names look secret (headers, environment variables)."""
    for name, value in values.items():
        if secret_name(name) or name.lower() in ("cookie", "set-cookie"):
            remember(value)


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["info"].partition(":")
    shown = f"{user}:{MASK}" if colon else MASK
    return f"{match['head']}{shown}@"


def redact(text: str) -> str:
    """``text`` with URL passwords, secret query values, credential headers and every
    remembered secret replaced by ``***``."""
    if not isinstance(text, str) or not text:
        return text
    forms = _forms
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    if "@" in text:
        text = _USERINFO.sub(_userinfo, text)
    if "=" in text:
        text = _QUERY.sub(rf"\g<head>{MASK}", text)
    text = _HEADER.sub(rf"\g<head>{MASK}", text)
    return _SCHEME_TOKEN.sub(rf"\g<head>{MASK}", text)


def redact_url(url: str) -> str:
    """``url`` safe to print or log: its password (or token user name) and the values of
    its secret query parameters replaced by ``***`` (also when it is malformed)."""
    return redact(url)


class _Redacting(logging.Filter):
    """Redacts a record's message and its exception text before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_FILTER = _Redacting()

THIRD_PARTY_LOGGERS = (
    "httpx",
    "httpx2",
    "mcp.client.streamable_http",
    "mcp.client.sse",
    "mcp.client.stdio",
    "mcp.client.session",
    "mcp.shared.session",
)
"""Loggers of libraries statekernel gives URLs, headers and environments to."""


def logger(name: str) -> logging.Logger:
    """The logger ``name``, its records redacted: statekernel's own, and those of the
    libraries it hands URLs and headers to (which log them at DEBUG or INFO)."""
    log = logging.getLogger(name)
    if _FILTER not in log.filters:
        log.addFilter(_FILTER)
    return log


for _name in THIRD_PARTY_LOGGERS:
    logger(_name)
