"""HTTP failures mapped to the ``ProviderError`` tree, with the vendor's own message."""

from __future__ import annotations

import email.utils
import json
import re
import sys
from collections.abc import Callable, Iterable
from types import ModuleType

import attrs
import httpx

from statekernel._secrets import redact as redact_text
from statekernel._secrets import remember
from statekernel.errors import (
    AuthenticationFailed,
    BadRequest,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)

__all__ = [
    "HTTP_ERRORS",
    "HTTPErrors",
    "error_for_status",
    "error_for_type",
    "error_from_exception",
    "error_in_answer",
    "redact",
    "retry_after_seconds",
    "vendor_message",
]

_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_MAX_MESSAGE = 500

# Vendor error types (Anthropic's ``error.type``, OpenAI's ``error.type``/``code``).
_TYPE_TO_ERROR: dict[str, type[ProviderError]] = {
    "overloaded_error": ProviderUnavailable,
    "api_error": ProviderUnavailable,
    "server_error": ProviderUnavailable,
    "timeout_error": ProviderUnavailable,
    "rate_limit_error": RateLimited,
    "rate_limit_exceeded": RateLimited,
    "insufficient_quota": RateLimited,
    "authentication_error": AuthenticationFailed,
    "permission_error": AuthenticationFailed,
    "invalid_api_key": AuthenticationFailed,
    "invalid_request_error": BadRequest,
    "not_found_error": BadRequest,
    "request_too_large": BadRequest,
}


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with ``secrets`` and everything ``statekernel._secrets.redact`` hides
    replaced by ``***`` (a vendor may echo a key back, an httpx error quote a header)."""
    for secret in secrets:
        remember(secret)
    return redact_text(text)


def vendor_message(body: bytes) -> tuple[str, str | None]:
    """The human message and the error type found in an error body, JSON or not."""
    try:
        data = json.loads(body)
    except ValueError:
        return _text_message(body), None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str):
            return error[:_MAX_MESSAGE], None
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail") or json.dumps(error)
            kind = error.get("type") or error.get("code")
            return str(message)[:_MAX_MESSAGE], str(kind) if kind else None
    return _text_message(body), None


def _text_message(body: bytes) -> str:
    head = body[:4096]
    if b"<html" in head.lower() or b"<!doctype" in head.lower():
        match = _TITLE.search(head)
        title = match.group(1).decode("utf-8", "replace").strip() if match else ""
        return f"HTML error page{': ' + title if title else ''}"
    text = body.decode("utf-8", "replace").strip()
    return text[:_MAX_MESSAGE] or "empty response body"


def retry_after_seconds(headers: httpx.Headers, clock: Callable[[], float]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - clock(), 0.0)


def error_for_status(
    provider: str,
    response: httpx.Response,
    body: bytes,
    *,
    clock: Callable[[], float],
    secrets: Iterable[str] = (),
) -> ProviderError:
    """The typed error for an HTTP error response, carrying the vendor's message."""
    status = response.status_code
    message, kind = vendor_message(body)
    label = f" {kind}" if kind else ""
    text = redact(f"{provider}: HTTP {status}{label}: {message}", secrets)
    if status == 429:
        retry_after = retry_after_seconds(response.headers, clock)
        return RateLimited(text, status=status, provider=provider, retry_after=retry_after)
    cls: type[ProviderError]
    if status in (401, 403):
        cls = AuthenticationFailed
    elif status == 408 or status >= 500:
        cls = ProviderUnavailable
    elif status >= 400:
        cls = _TYPE_TO_ERROR.get(kind or "", BadRequest)
    else:
        cls = ProviderError
    return cls(text, status=status, provider=provider)


def error_for_type(
    provider: str, kind: str | None, message: str, *, secrets: Iterable[str] = ()
) -> ProviderError:
    """The typed error for an error reported inside a stream (no HTTP status).

    An error of unknown type is ``ProviderUnavailable``: the server accepted the
    request and failed while answering.
    """
    cls = _TYPE_TO_ERROR.get(kind or "", ProviderUnavailable)
    label = f" {kind}" if kind else ""
    text = redact(f"{provider}: stream error{label}: {message}", secrets)
    if cls is RateLimited:
        return RateLimited(text, status=None, provider=provider)
    return cls(text, provider=provider)


def error_in_answer(provider: str, error: object, *, secrets: Iterable[str] = ()) -> ProviderError:
    """The typed error for an ``error`` object (or string) a server sent in place of an
    answer, in a stream or in a 200 body: its ``type`` (or ``code``) picks the class as
    ``error_for_type`` does, so the retries follow it."""
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or json.dumps(error)[:_MAX_MESSAGE]
        kind = error.get("type") or error.get("code")
        return error_for_type(provider, str(kind) if kind else None, str(message), secrets=secrets)
    return error_for_type(provider, None, str(error)[:_MAX_MESSAGE], secrets=secrets)


Classes = tuple[type[Exception], ...]

_FAMILY = (
    "HTTPError",
    "TimeoutException",
    "ConnectError",
    "ConnectTimeout",
    "UnsupportedProtocol",
    "LocalProtocolError",
)
"""The exception classes a library of the httpx family (httpx, httpx2) names alike."""


@attrs.frozen
class HTTPErrors:
    """The exception classes of the HTTP libraries a provider's failures come from:
    httpx's (``httpx-sse`` raises them whatever the client) and those of the library of
    its client when that is another of the httpx family, such as ``httpx2``, whose
    exceptions have the same names and tree but are classes of their own.

    ``of(client)`` finds them; ``error_from_exception`` and the retries then treat the
    failures of either library alike.
    """

    http: Classes
    """``HTTPError``: every failure of a request."""
    timeout: Classes
    """``TimeoutException``."""
    unreachable: Classes
    """``ConnectError`` and ``ConnectTimeout``: the server could not be reached."""
    refused: Classes
    """``UnsupportedProtocol`` and ``LocalProtocolError``: the request itself is wrong."""

    @classmethod
    def of(cls, client: object) -> HTTPErrors:
        """The exception classes of httpx and of the library ``client`` (an
        ``httpx.AsyncClient``, an ``httpx2.AsyncClient`` or a subclass of either)
        comes from.

        Returns:
            httpx's classes, with the client's library's added when that is another
            library of the httpx family.
        """
        libraries = [httpx]
        for klass in type(client).__mro__:
            library = sys.modules.get(klass.__module__.partition(".")[0])
            if library is not None and library not in libraries and _of_the_family(library):
                libraries.append(library)
        return cls.of_libraries(libraries)

    @classmethod
    def of_libraries(cls, libraries: Iterable[ModuleType]) -> HTTPErrors:
        """The exception classes of ``libraries`` (modules of the httpx family).

        Returns:
            Each kind of failure as the tuple of the libraries' classes for it.
        """

        def named(*names: str) -> Classes:
            return tuple(getattr(library, name) for library in found for name in names)

        found = list(libraries)
        return cls(
            named("HTTPError"),
            named("TimeoutException"),
            named("ConnectError", "ConnectTimeout"),
            named("UnsupportedProtocol", "LocalProtocolError"),
        )


def _of_the_family(library: ModuleType) -> bool:
    """Whether ``library`` names every exception class of the httpx family."""
    for name in _FAMILY:
        found = getattr(library, name, None)
        if not (isinstance(found, type) and issubclass(found, Exception)):
            return False
    return True


HTTP_ERRORS = HTTPErrors.of_libraries([httpx])
"""httpx's exception classes."""


def error_from_exception(
    provider: str, exc: Exception, errors: HTTPErrors = HTTP_ERRORS
) -> ProviderError:
    """A failure of a request (connect, timeout, dropped connection) as a typed error;
    ``errors`` are the exception classes it may be of (httpx's by default)."""
    if isinstance(exc, errors.timeout):
        return ProviderUnavailable(
            f"{provider}: timed out ({type(exc).__name__})", provider=provider
        )
    if isinstance(exc, errors.refused):
        return BadRequest(redact(f"{provider}: {exc}"), provider=provider)
    message = redact(f"{provider}: {type(exc).__name__}: {exc}")
    return ProviderUnavailable(message, provider=provider)
