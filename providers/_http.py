"""What every HTTP provider shares: one client, timeouts, bounded retries, error mapping.

A request is retried (exponential backoff with jitter, honouring ``Retry-After``) only
until its stream has yielded a first part. After that a failure raises
``ProviderUnavailable``: the caller decides whether to call the model again. Usage
reported before any content (Anthropic's ``message_start``) is held back until the
first content part, so an overload error right after it can still be retried.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs
import httpx

from statekernel._records.messages import ModelRequest
from statekernel._secrets import redact_url, remember_url
from statekernel._storage.provider import StreamPart, UsageUpdate
from statekernel.errors import ProviderError, ProviderUnavailable, RateLimited
from statekernel.providers._errors import (
    HTTPErrors,
    error_for_status,
    error_from_exception,
    redact,
)

if TYPE_CHECKING:
    import httpx2

__all__ = ["DEFAULT_TIMEOUT", "HTTPProvider", "RetryPolicy", "Sleep", "closing_stream"]

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]
Parser = Callable[[httpx.Response, ModelRequest], AsyncGenerator[StreamPart, None]]

DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=10.0)
"""Connect quickly; allow long silences while a model thinks before its first token."""


@attrs.frozen
class RetryPolicy:
    """Bounded retries on 429, 5xx, overload and connection failures.

    ``max_attempts`` counts the first try. The n-th retry waits
    ``min(max_delay, initial_delay * 2**(n-1))`` less up to ``jitter`` of it, or exactly
    what the server's ``Retry-After`` asks; a ``Retry-After`` above ``max_retry_after``
    is not waited for (the ``RateLimited`` error is raised with its ``retry_after``).
    """

    max_attempts: int = 4
    initial_delay: float = 0.5
    max_delay: float = 20.0
    jitter: float = 0.25
    max_retry_after: float = 60.0

    def delay(self, attempt: int, error: ProviderError, rng: random.Random) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None to give up.

        Returns:
            The delay in seconds (the server's ``Retry-After`` when ``error`` carries
                one), or None: ``attempt`` reached ``max_attempts``, ``error`` is neither
                ``RateLimited`` nor ``ProviderUnavailable``, or its ``Retry-After`` is
                above ``max_retry_after``.
        """
        if attempt >= self.max_attempts or not isinstance(error, RateLimited | ProviderUnavailable):
            return None
        retry_after = error.retry_after if isinstance(error, RateLimited) else None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        backoff = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
        return backoff * (1.0 - self.jitter * rng.random())


@asynccontextmanager
async def closing_stream(stream: AsyncIterator[T]) -> AsyncGenerator[AsyncIterator[T], None]:
    """Use ``stream`` and close it on exit (also on cancellation) if it can be closed."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


class HTTPProvider:
    """Base of the httpx providers: subclasses build payloads and parse responses.

    ``client`` is shared by every request of the provider; one passed in belongs to
    the caller (its own timeouts apply and ``aclose`` leaves it open). It may be an
    ``httpx2.AsyncClient`` too: its failures are mapped and retried as httpx's are
    (``HTTPErrors``). ``sleep``, ``clock`` and ``rng`` are injectable so tests never
    really wait.
    """

    name = "http"
    url_variable: str | None = None
    """The environment variable that sets ``base_url`` (named when the server cannot be
    reached)."""

    def __init__(
        self,
        *,
        base_url: str,
        client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
        timeout: httpx.Timeout | float | None = None,
        retry: RetryPolicy | None = None,
        streaming: bool = True,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        remember_url(self.base_url)  # a proxy's credentials never show in an error
        self.retry = retry or RetryPolicy()
        self.streaming = streaming
        self._owns_client = client is None
        # an httpx2 client's responses have the API of httpx's, which the parsers read
        self._client = (
            cast("httpx.AsyncClient", client)
            if client is not None
            else httpx.AsyncClient(timeout=timeout or DEFAULT_TIMEOUT)
        )
        self._errors = HTTPErrors.of(self._client)
        self._timeout = timeout
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={redact_url(self.base_url)!r})"

    # -- subclass hooks -------------------------------------------------------------

    def _secrets(self) -> Iterable[str]:
        return ()

    def _endpoint(self, request: ModelRequest, streaming: bool) -> str:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        return {}

    def _payload(self, request: ModelRequest, streaming: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _parse_stream(
        self, response: httpx.Response, request: ModelRequest
    ) -> AsyncGenerator[StreamPart, None]:
        raise NotImplementedError

    def _parse_body(self, data: Any, request: ModelRequest) -> Iterable[StreamPart]:
        raise NotImplementedError

    # -- the protocol -----------------------------------------------------------------

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        """Send ``request`` and yield its parts; ``options["stream"]`` may turn streaming off.

        Retries follow ``retry``: a failure is raised once retrying gives up.

        Yields:
            The stream parts of the answer, the last a ``StreamEnd``.

        Raises:
            RateLimited: HTTP 429 (or a rate-limit error in the stream).
            AuthenticationFailed: HTTP 401 or 403.
            BadRequest: another HTTP 4xx: the server refused the request.
            ProviderUnavailable: HTTP 408 or 5xx, an unreachable server, a broken
                connection or a response that cannot be read.
        """
        options = request.options if isinstance(request.options, Mapping) else {}
        streaming = bool(options.get("stream", self.streaming))
        payload = self._payload(request, streaming)
        parse = self._parse_stream if streaming else self._parse_whole
        url = self._endpoint(request, streaming)
        async with aclosing(self._send(url, payload, request, parse)) as parts:
            async for part in parts:
                yield part

    async def aclose(self) -> None:
        """Close the HTTP client if this provider created it."""
        if self._owns_client:
            await self._client.aclose()

    # -- machinery --------------------------------------------------------------------

    async def _parse_whole(
        self, response: httpx.Response, request: ModelRequest
    ) -> AsyncGenerator[StreamPart, None]:
        data = self._json(await response.aread())
        for part in self._parse_body(data, request):
            yield part

    def _json(self, raw: bytes | str) -> Any:
        """Parse a JSON body or chunk; garbage is a (retryable) ``ProviderUnavailable``."""
        try:
            return json.loads(raw)
        except ValueError as exc:
            snippet = raw[:200] if isinstance(raw, str) else raw[:200].decode("utf-8", "replace")
            raise ProviderUnavailable(
                f"{self.name}: malformed JSON from server: {snippet!r}", provider=self.name
            ) from exc

    def _check_json_fallback(self, response: httpx.Response) -> bool:
        """True when a server answered a streaming request with one JSON body."""
        content_type = response.headers.get("content-type", "")
        return "application/json" in content_type

    async def _send(
        self, url: str, payload: dict[str, Any], request: ModelRequest, parse: Parser
    ) -> AsyncGenerator[StreamPart, None]:
        attempt = 1
        while True:
            started = False
            try:
                async with self._open(url, payload) as response:
                    await self._raise_for_status(response)
                    if parse != self._parse_whole and self._check_json_fallback(response):
                        parse = self._parse_whole
                    held: list[StreamPart] = []  # usage before any content: keeps retry safe
                    async with aclosing(parse(response, request)) as parts:
                        async for part in parts:
                            if not started and isinstance(part, UsageUpdate):
                                held.append(part)
                                continue
                            started = True
                            for early in held:
                                yield early
                            held.clear()
                            yield part
                for early in held:
                    yield early
                return
            except self._errors.http as exc:
                error = error_from_exception(self.name, exc, self._errors)
                if isinstance(exc, self._errors.unreachable):
                    error = self._unreachable(exc, error)
                error.__cause__ = exc
            except ProviderError as exc:
                error = exc
            if started:
                raise self._interrupted(error)
            delay = self.retry.delay(attempt, error, self._rng)
            if delay is None:
                raise error
            await self._sleep(delay)
            attempt += 1

    def _open(
        self, url: str, payload: dict[str, Any]
    ) -> AbstractAsyncContextManager[httpx.Response]:
        headers = {"content-type": "application/json", **self._headers()}
        content = json.dumps(payload, ensure_ascii=False).encode()
        if self._timeout is not None:
            return self._client.stream(
                "POST", url, content=content, headers=headers, timeout=self._timeout
            )
        return self._client.stream("POST", url, content=content, headers=headers)

    async def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        body = await response.aread()
        raise error_for_status(
            self.name, response, body, clock=self._clock, secrets=self._secrets()
        )

    def _unreachable(self, exc: Exception, error: ProviderError) -> ProviderError:
        """``error`` naming the server that could not be reached and what sets its URL."""
        source = f"set by {self.url_variable} or base_url=" if self.url_variable else "base_url="
        message = redact(
            f"{self.name}: cannot reach {redact_url(self.base_url)} ({source}): "
            f"{type(exc).__name__}: {exc}"
        )
        return type(error)(message, provider=self.name)

    def _interrupted(self, error: ProviderError) -> ProviderError:
        if not isinstance(error, RateLimited | ProviderUnavailable):
            return error
        message = redact(f"{error} (the stream had already started)", self._secrets())
        interrupted = ProviderUnavailable(message, status=error.status, provider=self.name)
        interrupted.__cause__ = error
        return interrupted
