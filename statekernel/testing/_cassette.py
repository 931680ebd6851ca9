"""``Cassette``: record any provider's stream parts to a JSON file and replay them exactly.

A recording is keyed by a hash of the request (model, messages, tools, settings), so
a test that sends the same requests gets the same answers, offline and
deterministically. The n-th identical request replays the n-th recording made for it.
A provider error is recorded too (after the parts that preceded it) and raised again
on replay. The file holds stream parts only: never credentials or headers.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
from cattrs.strategies import configure_tagged_union

from statekernel import errors
from statekernel._records.convert import unstructure
from statekernel._records.messages import ModelRequest
from statekernel._storage.provider import (
    ModelProvider,
    ReasoningDelta,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
)
from statekernel.errors import BadRequest, ProviderError

__all__ = ["Cassette", "CassetteMode", "request_key"]

CassetteMode = Literal["auto", "record", "replay"]
FORMAT_VERSION = 1

_TAGS: dict[type, str] = {
    TextDelta: "text",
    ReasoningDelta: "reasoning",
    ToolCallDelta: "tool_call_delta",
    ToolCallDone: "tool_call",
    UsageUpdate: "usage",
    StreamEnd: "finish",
}
_parts = cattrs.Converter(omit_if_default=True, forbid_extra_keys=True)
configure_tagged_union(
    StreamPart,
    _parts,
    tag_generator=lambda cls: _TAGS[cls],
    tag_name="type",
)


def request_key(request: ModelRequest) -> str:
    """A stable hash of everything in ``request`` (hex SHA-256).

    Returns:
        64 hex digits, equal for equal requests.
    """
    data = json.dumps(unstructure(request), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


@attrs.define
class _Recording:
    key: str
    model: str
    parts: list[Any]
    error: dict[str, Any] | None = None


class Cassette:
    """A ``ModelProvider`` that replays recorded answers, recording missing ones.

    ``mode``: ``"auto"`` replays what the file holds and records the rest through
    ``provider``; ``"replay"`` never calls a provider (a request without a recording
    raises ``BadRequest``); ``"record"`` calls ``provider`` for every request and
    replaces the file's recordings with the new ones. The file is rewritten
    atomically after every recording. ``aclose`` closes the wrapped provider.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        provider: ModelProvider | None = None,
        *,
        mode: CassetteMode = "auto",
    ) -> None:
        if mode not in ("auto", "record", "replay"):
            raise errors.ConfigError(f"cassette mode must be auto, record or replay: {mode!r}")
        if mode == "record" and provider is None:
            raise errors.ConfigError("a cassette in record mode needs a provider")
        self.path = Path(path)
        self.provider = provider
        self.mode = mode
        self._recordings: list[_Recording] = [] if mode == "record" else _load(self.path)
        self._used: dict[str, int] = {}
        self.replayed = 0
        self.recorded = 0

    def __repr__(self) -> str:
        return f"Cassette({str(self.path)!r}, mode={self.mode!r})"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        """Replay the recording for ``request``, or record one through the provider.

        Yields:
            The recorded parts (or the provider's, as they are recorded).

        Raises:
            BadRequest: there is no recording for ``request`` and the cassette cannot
                record one (``mode="replay"``, or no provider).
            ProviderError: the error that was recorded for ``request``, replayed, or
                the provider's while recording (recorded too).
        """
        key = request_key(request)
        seen = self._used.get(key, 0)
        self._used[key] = seen + 1
        matches = [r for r in self._recordings if r.key == key]
        if seen < len(matches) and self.mode != "record":
            self.replayed += 1
            recording = matches[seen]
            for item in recording.parts:
                yield _parts.structure(item, StreamPart)  # type: ignore[arg-type]
            if recording.error is not None:
                raise _error(recording.error)
            return
        if self.provider is None or self.mode == "replay":
            raise BadRequest(
                f"cassette {self.path.name}: no recording for request {key[:12]} "
                f"(model {request.model}, {len(request.messages)} messages); "
                "record it with mode='auto' or 'record' and a provider",
                provider="cassette",
            )
        async with aclosing(self._record(key, request, self.provider)) as parts:
            async for part in parts:
                yield part

    async def _record(
        self, key: str, request: ModelRequest, provider: ModelProvider
    ) -> AsyncGenerator[StreamPart, None]:
        recording = _Recording(key, request.model, [])
        stream = provider.stream(request)
        try:
            async for part in stream:
                recording.parts.append(_parts.unstructure(part, StreamPart))
                yield part
        except ProviderError as exc:
            recording.error = _error_data(exc)
            self._save(recording)
            raise
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        self._save(recording)

    def _save(self, recording: _Recording) -> None:
        self._recordings.append(recording)
        self.recorded += 1
        data = {
            "version": FORMAT_VERSION,
            "recordings": [attrs.asdict(r) for r in self._recordings],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, ensure_ascii=False)
            out.write("\n")
        os.replace(tmp, self.path)

    async def aclose(self) -> None:
        """Close the wrapped provider, if any."""
        if self.provider is not None:
            await self.provider.aclose()


def _load(path: Path) -> list[_Recording]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown cassette version {data.get('version')!r}")
        return [_Recording(**item) for item in data["recordings"]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise errors.ConfigError(f"cassette {path}: not a valid cassette file ({exc})") from exc


def _error(data: dict[str, Any]) -> ProviderError:
    cls = getattr(errors, str(data.get("type")), ProviderError)
    if not (isinstance(cls, type) and issubclass(cls, ProviderError)):
        cls = ProviderError
    message, status = str(data.get("message", "")), data.get("status")
    if cls is errors.RateLimited:
        return errors.RateLimited(
            message, status=status, provider="cassette", retry_after=data.get("retry_after")
        )
    return cls(message, status=status, provider="cassette")


def _error_data(exc: ProviderError) -> dict[str, Any]:
    data: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "status": exc.status}
    if isinstance(exc, errors.RateLimited):
        data["retry_after"] = exc.retry_after
    return data
