"""Redaction: the one function every text statekernel prints, logs, stores, raises, puts
in a span or hands to a model passes through where it may carry a secret.

``redact(text)`` hides, wherever they appear in ``text``:

* the password of a URL's userinfo (``redis://user:***@host``), or the whole userinfo
  when it has no password (``https://***@host``: a token used as the user name);
* the values of URL query parameters whose names hold a secret word (``password``,
  ``token``, ``key``, ``secret``, ``auth``, ``sig``, ``credential``, ``cookie``,
  ``private``, ``session``, ...: ``access_token``, ``X-Amz-Signature``; whole words, so
  ``keyword`` or ``author`` are not);
* the values (8 characters or more) of credential headers (``Authorization: Bearer ***``,
  ``x-api-key: ***``, ``api-key``, ``x-auth-token``) and any ``Bearer``/``Basic`` token
  (12 characters or more with a digit or a symbol, so ``Basic authentication`` stays);
* every secret (8 characters or more) handed to statekernel's configuration
  (``remember``: provider API keys, passwords and secret parameters of store and MCP
  URLs, MCP credential headers and environment values whose names hold a secret word),
  in every form it takes in text: as given, stripped, JSON- or ``repr``-escaped,
  URL-quoted, as the ``repr`` of its bytes.

Every pattern bounds its repetitions, so redacting is linear in the text.

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
_MIN = 8
"""Shorter values are not remembered: masking them would garble ordinary text (a URL's
password or a header's value is hidden by its place whatever its length)."""

_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "token",
        "key",
        "apikey",
        "secret",
        "auth",
        "authorization",
        "sig",
        "signature",
        "credential",
        "credentials",
        "cookie",
        "private",
        "privatekey",
        "accesskey",
    }
)
"""Words that make a name secret, matched whole (``GITHUB_TOKEN``, ``x-api-key``,
``access_token``), so that ``TOKENIZERS_PARALLELISM`` or ``KEYBOARD`` are not."""
_SECRET_IN_QUERY = _SECRET_WORDS | {"session", "sessionid", "code"}
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*|[a-z0-9]+")
# Every repetition is bounded, so no pattern backtracks over a long run of text.
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]{0,30}://)(?P<info>[^/?#\s]{1,512})@")
_QUERY = re.compile(r"(?P<head>[?&;](?P<name>[^=&?#;\s'\"<>]{1,64})=)(?P<value>[^&#;\s'\"<>)\]]+)")
_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?(?:authorization|x-api-key|api-key|x-goog-api-key|"
    r"x-auth-token)['\"]?\s{0,8}[:=]\s{0,8}['\"]?"
    r"(?:(?:bearer|basic|token)\s{1,8})?)(?P<value>[^\s'\",;}]{8,})",
    re.IGNORECASE,
)
_SCHEME_TOKEN = re.compile(
    r"(?P<head>\b(?:Bearer|Basic)\s{1,8})(?P<value>(?=[A-Za-z0-9._~+/=-]{0,4096}[0-9._~+/=-])"
    r"[A-Za-z0-9._~+/=-]{12,})"
)

_lock = threading.Lock()
_known: set[str] = set()
_forms: tuple[str, ...] = ()
"""Every form of every remembered secret, longest first."""


def secret_name(name: str, *, words: frozenset[str] = _SECRET_WORDS) -> bool:
    """True when a parameter, header or variable named ``name`` looks like a secret: one
    of its words (split at ``_``, ``-``, ``.`` and case changes) is a secret word."""
    return any(w.lower() in words for w in _WORD.findall(name))


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
    """Remember the password and the secret query values of ``url`` (a user name without
    a password is hidden where the URL shows, but not remembered: ``postgres@`` is not a
    secret to hide from every text)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    info = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    password = info.partition(":")[2]
    remember(unquote(password) if password else None)  # a bare user name may be a word
    for pair in re.split(r"[&;]", parts.query):
        name, _, value = pair.partition("=")
        if value and secret_name(name, words=_SECRET_IN_QUERY):
            remember(unquote(value))


def remember_secret_values(values: Mapping[str, str]) -> None:
    """Remember the values whose names look secret (headers, environment variables)."""
    for name, value in values.items():
        if secret_name(name):
            remember(value)


def _query_value(match: re.Match[str]) -> str:
    if secret_name(match["name"], words=_SECRET_IN_QUERY):
        return f"{match['head']}{MASK}"
    return match[0]


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
        text = _QUERY.sub(_query_value, text)
    text = _HEADER.sub(rf"\g<head>{MASK}", text)
    return _SCHEME_TOKEN.sub(rf"\g<head>{MASK}", text)


def redact_url(url: str) -> str:
    """``url`` safe to print or log: its password (or token user name) and the values of
    its secret query parameters replaced by ``***`` (also when it is malformed).

    Returns:
        The redacted URL (``url`` itself when it holds no secret).
    """
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
    "client",  # the MCP SDK's client session logs under this bare name
    "mcp.client.client",
    "mcp.client.streamable_http",
    "mcp.client.sse",
    "mcp.client.stdio",
    "mcp.client.auth.oauth2",
    "mcp.shared.dispatcher",
    "mcp.shared.jsonrpc_dispatcher",
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
