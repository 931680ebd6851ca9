"""Redaction: the one function every text statekernel prints, logs, stores, raises, puts
in a span or hands to a model passes through where it may carry a secret.

``redact(text)`` hides, wherever they appear in ``text``:

* the password of a URL's userinfo (``redis://user:***@host``), or the whole userinfo
  when it has no password (``https://***@host``: a token used as the user name);
* the values of URL query parameters whose names are secret (``secret_name``, the one
  rule of every place that judges a name: ``password``, ``sslpassword``,
  ``access_token``, ``apitoken``, ``clientsecret``, ``X-Amz-Signature``, ``sig``, ...;
  not ``author``, ``keyspace``, ``max_tokens``);
* the values (8 characters or more, and not a plain word: ``authorization: denied``
  stays) of headers and fields with a secret name (``Authorization: Bearer ***``,
  ``'x-api-key': '***'``, ``"client_secret": "***"``, ``Cookie: ***``,
  ``password=***``) and any ``Bearer``/``Basic`` token (12 characters or more with a
  digit or a symbol, so ``Basic authentication`` stays);
* every secret (8 characters or more) handed to statekernel's configuration
  (``remember``: provider API keys, passwords and secret parameters of store and MCP
  URLs, MCP headers and environment values with a secret name), in every form it
  takes in text: as given, stripped, JSON- or ``repr``-escaped, URL-quoted, as the
  ``repr`` of its bytes.

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

_SECRET_ANYWHERE = re.compile(
    r"passw(?:or)?d|passphrase|passcode|pwd|secret|credential|signature|cookie|jwt"
    r"|token(?!s|i[sz]|count|limit)"  # not max_tokens, totalTokenCount, tokenizer
    r"|(?:access|refresh|id|api|auth|session|bearer|security|private|oauth)tokens"
    r"|(?<!require)auth(?!or(?!i[sz]))"  # authorization, oauth; not author, require_auth
    r"|(?:api|access|private|signing)key"  # AWSAccessKeyId, private_key_id
    r"|sess(?:ion)?id"  # session_id, JSESSIONID, PHPSESSID
    r"|codeverifier"
)
"""Secret words that count wherever they stand in a name."""
_SECRET_AT_END = re.compile(r"(?:key|pass|sig|sas|session)\d{0,4}$")
"""Secret words too short or too common to count inside a name: they count at its end
(``x-api-key``, ``db_pass``, ``sig``, ``user_session``), so ``keyspace``, ``passfile``,
``design`` and ``xdg_session_type`` are not secret."""
_ORDINARY_END = re.compile(
    r"(?:(?:mon|don|tur|hoc|joc|whis|hot|turn|idempotency|public|primary|foreign"
    r"|partition|sort|cache|routing)key|(?:by|com|over|under|tres)pass)\d{0,4}$"
)
"""Names ending in a secret word that are no secret: ordinary words (``monkey``,
``bypass``) and keys that name or order data (``primary_key``, ``idempotency_key``)."""
_NOT_NAME = re.compile(r"[^a-z0-9]+")
# Every repetition is bounded, so no pattern backtracks over a long run of text.
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]{0,30}://)(?P<info>[^/?#\s]{1,512})@")
_QUERY = re.compile(r"(?P<head>[?&;](?P<name>[^=&?#;\s'\"<>]{1,64})=)(?P<value>[^&#;\s'\"<>)\]]+)")
_FIELD = re.compile(
    r"(?<![\w.-])(?P<name>[A-Za-z][\w.-]{0,63})['\"]?\s{0,8}[:=]\s{0,8}['\"]?"
    r"(?P<scheme>(?i:bearer|basic|token)\s{1,8})?"
    r"(?=(?P<value>(?:[\w.-]{1,64}=)?[^\s'\",;&:=()\[\]{}<>]{8,}+={0,3}+)(?![(\[]))"
)
"""A header or field in text (``Authorization: Bearer ...``, ``'x-api-key': '...'``,
``"client_secret": "..."``, ``password=...``, ``Cookie: sid=...``); not code, as a
traceback quotes it (``token = lease.token``, ``key: call_key(...)``). The match ends
before the value, so a field inside the value of another is found too."""
_WORD = r"(?>[A-Z]{3,24}|[A-Za-z][a-z]{0,23}(?:[A-Z][a-z]{1,23}){0,8}[A-Z]?)"
_PLAIN = re.compile(rf"_{{0,2}}{_WORD}(?:[._]{{1,3}}{_WORD}){{0,15}}[.!?]?")
"""A value of words without digits (``denied``, ``ClientSession``, ``self._session``,
``REDIS_PASSWORD``): prose, or code as a traceback quotes it, not a credential (whose
random letters mix cases within a word or come with digits); after ``Bearer``, every
value is one."""
_PLAIN_MAX = 160
_SCHEME_TOKEN = re.compile(
    r"(?P<head>\b(?:Bearer|Basic)\s{1,8})(?P<value>(?=[A-Za-z0-9._~+/=-]{0,4096}[0-9._~+/=-])"
    r"[A-Za-z0-9._~+/=-]{12,})"
)

_lock = threading.Lock()
_known: set[str] = set()
_forms: tuple[str, ...] = ()
"""Every form of every remembered secret, longest first."""


def secret_name(name: str, *, in_url: bool = False) -> bool:
    """Whether a URL query parameter, header, field or environment variable named
    ``name`` holds a secret: the one rule of every place that decides it by a name.

    The name is compared in lower case with everything but letters and digits dropped
    (``X-API-Key``, ``x_api_key`` and ``XApiKey`` are one name). It is secret when:

    * it holds, anywhere, ``password``/``passwd``/``pwd``, ``passphrase``,
      ``passcode``, ``secret``, ``credential``, ``signature``, ``cookie``, ``jwt``,
      ``token``, ``auth``, ``apikey``/``accesskey``/``privatekey``/``signingkey``,
      ``sessionid``/``sessid`` or ``codeverifier``: ``sslpassword``, ``clientsecret``,
      ``X-Amz-Security-Token``, ``Proxy-Authorization``, ``Set-Cookie``,
      ``AWSAccessKeyId``, ``JSESSIONID``;
    * or it ends with ``key``, ``pass``, ``sig``, ``sas`` or ``session`` (digits
      after them allowed): ``sslkey``, ``STRIPE_KEY``, ``db_pass``, ``sig`` (an Azure
      SAS signature), ``session``;
    * or, in a URL (``in_url``), it is ``code`` (an OAuth authorization code; in text,
      ``"code": ...`` is an error's code).

    What is not: ``tokens`` (but ``access_tokens``, ``refresh_tokens``, ``api_tokens``
    and their kin are) and ``token`` followed by ``count``, ``limit`` or ``iz``
    (counts and tokenizers: ``max_tokens``, ``totalTokenCount``,
    ``TOKENIZERS_PARALLELISM``); ``author`` and ``authority`` (but ``authorization``
    is); ``require_auth`` (libpq's list of methods); ``key`` or ``pass`` inside a name
    (``keyspace``, ``keyboard``, ``passfile``: a path) or ending an ordinary word
    (``monkey``, ``bypass``) or a key that names data (``primary_key``, ``cache_key``,
    ``idempotency_key``, ``public_key``); ``session`` inside a name
    (``xdg_session_type``, ``target_session_attrs``). A name that only may be secret
    counts as one: hiding a value costs less than showing a credential.
    """
    flat = _NOT_NAME.sub("", name.lower())
    if _SECRET_ANYWHERE.search(flat):
        return True
    if _SECRET_AT_END.search(flat) and not _ORDINARY_END.search(flat):
        return True
    return in_url and flat == "code"


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
        if value and secret_name(name, in_url=True):
            remember(unquote(value))


def remember_secret_values(values: Mapping[str, str]) -> None:
    """Remember the values whose names look secret (headers, environment variables)."""
    for name, value in values.items():
        if secret_name(name):
            remember(value)


def _query_value(match: re.Match[str]) -> str:
    if secret_name(match["name"], in_url=True):
        return f"{match['head']}{MASK}"
    return match[0]


def _fields(text: str) -> str:
    parts: list[str] = []
    done = 0
    for match in _FIELD.finditer(text):
        value = match["value"]
        if match.start() < done or (match["scheme"] is None and _plain(value)):
            continue
        if secret_name(match["name"]):
            parts += (text[done : match.end()], MASK)
            done = match.end() + len(value)
    return "".join(parts) + text[done:] if parts else text


def _plain(value: str) -> bool:
    return len(value) <= _PLAIN_MAX and _PLAIN.fullmatch(value) is not None


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["info"].partition(":")
    shown = f"{user}:{MASK}" if colon else MASK
    return f"{match['head']}{shown}@"


def redact(text: str) -> str:
    """``text`` with URL passwords, the values of secret query parameters, headers and
    fields, and every remembered secret replaced by ``***``."""
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
    if ":" in text or "=" in text:
        text = _fields(text)
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
