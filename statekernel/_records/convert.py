"""The one cattrs converter: records to JSON-able data and back, with schema migrations.

Every record a store keeps goes through this converter, and so do exports
(``unstructure``, ``dumps``). Its hooks for strings, JSON values, times, a request's
messages and tools and a result's message are the stored format's
(``statekernel._records.storing``): inside a store's ``storing``/``loading`` context
they keep each thing once (blobs, references into the message log); outside it they
give plain data (ISO times, lists, strings).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from statekernel._records import storing as hooks
from statekernel._records.lazy import LazyTuple
from statekernel._records.messages import (
    ContentPart,
    ImagePart,
    Message,
    ModelRequest,
    ModelResult,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from statekernel._records.pauses import (
    ChildWait,
    HookPause,
    MaxTurns,
    PauseDetails,
    Question,
    Rerun,
    Resolution,
    ResolvedError,
    ResolvedOutput,
    Uncertain,
)
from statekernel._records.run import SCHEMA_VERSION, PauseInfo, Run, ToolCallRecord, Turn
from statekernel._records.upgrade_v1 import from_v1
from statekernel.errors import CorruptCheckpoint

__all__ = [
    "SCHEMA_VERSION",
    "Migration",
    "check_version",
    "converter",
    "dumps",
    "loads",
    "migrate",
    "register_migration",
    "structure",
    "structure_run",
    "to_plain",
    "unstructure",
    "unstructure_head",
    "upgrade",
]

T = TypeVar("T")

_PART_TAGS: dict[type, str] = {
    TextPart: "text",
    ImagePart: "image",
    ReasoningPart: "reasoning",
    ToolCall: "tool_call",
    ToolResult: "tool_result",
}

converter = cattrs.Converter(omit_if_default=True, forbid_extra_keys=True)
"""The converter used for every stored record."""

converter.register_unstructure_hook(str, hooks.unstructure_str)
converter.register_structure_hook(str, hooks.structure_str)
converter.register_structure_hook(int, hooks.structure_int)
converter.register_structure_hook(bool, hooks.structure_bool)
converter.register_structure_hook(float, hooks.structure_float)
converter.register_unstructure_hook_func(lambda t: t is Any, hooks.unstructure_json)
converter.register_structure_hook_func(lambda t: t is Any, hooks.structure_json)
converter.register_unstructure_hook(datetime, hooks.unstructure_time)
converter.register_structure_hook(datetime, hooks.structure_time)
configure_tagged_union(
    ContentPart,
    converter,
    tag_generator=lambda cls: _PART_TAGS[cls],
    tag_name="type",
)

_PAUSE_TAGS: dict[type, str] = {
    Uncertain: "uncertain",
    Question: "question",
    ChildWait: "child",
    MaxTurns: "max_turns",
    HookPause: "hook",
}
_RESOLUTION_TAGS: dict[type, str] = {
    ResolvedOutput: "output",
    ResolvedError: "error",
    Rerun: "rerun",
}
configure_tagged_union(
    Resolution, converter, tag_generator=lambda cls: _RESOLUTION_TAGS[cls], tag_name="kind"
)
configure_tagged_union(
    PauseDetails, converter, tag_generator=lambda cls: _PAUSE_TAGS[cls], tag_name="kind"
)


def _is_lazy_tuple(cls: Any) -> bool:
    return cls is LazyTuple or get_origin(cls) is LazyTuple


def _structure_lazy_tuple(value: Any, cls: Any) -> LazyTuple[Any]:
    (item,) = get_args(cls) or (Any,)
    return LazyTuple(converter.structure(value, tuple[item, ...]))  # type: ignore[valid-type]


converter.register_unstructure_hook_func(
    _is_lazy_tuple, lambda value: [converter.unstructure(item) for item in value]
)
converter.register_structure_hook_func(_is_lazy_tuple, _structure_lazy_tuple)


def _message(message: Message) -> Any:
    return converter.unstructure(message, Message)


def _message_of(doc: Any) -> Message:
    return converter.structure(doc, Message)


def _spec(spec: ToolSpec) -> Any:
    return converter.unstructure(spec, ToolSpec)


def _specs_of(doc: Any) -> tuple[ToolSpec, ...]:
    return converter.structure(doc, tuple[ToolSpec, ...])


# Registered after the scalar, union and LazyTuple hooks, so the generated functions use them.
converter.register_unstructure_hook(
    ModelRequest,
    make_dict_unstructure_fn(
        ModelRequest,
        converter,
        _cattrs_omit_if_default=True,
        messages=override(unstruct_hook=lambda v: hooks.unstructure_sent(v, _message)),
        tools=override(unstruct_hook=lambda v: hooks.unstructure_tools(v, _spec)),
    ),
)
converter.register_structure_hook(
    ModelRequest,
    make_dict_structure_fn(
        ModelRequest,
        converter,
        _cattrs_forbid_extra_keys=True,
        messages=override(struct_hook=lambda v, _: hooks.structure_sent(v, _message_of)),
        tools=override(struct_hook=lambda v, _: hooks.structure_tools(v, _specs_of)),
    ),
)
converter.register_unstructure_hook(
    ModelResult,
    make_dict_unstructure_fn(
        ModelResult,
        converter,
        _cattrs_omit_if_default=True,
        message=override(unstruct_hook=lambda v: hooks.unstructure_answer(v, _message)),
    ),
)
_result_of = make_dict_structure_fn(
    ModelResult,
    converter,
    _cattrs_forbid_extra_keys=True,
    message=override(struct_hook=lambda v, _: hooks.structure_answer(v, _message_of)),
)
converter.register_structure_hook(
    ModelResult, lambda doc, cls: hooks.result_calls(_result_of(doc, cls))
)
# A pause is stored inline (no blobs), so a run listing reads it off the head.
_pause_doc = make_dict_unstructure_fn(PauseInfo, converter, _cattrs_omit_if_default=True)
converter.register_unstructure_hook(
    PauseInfo, lambda pause: hooks.unstructure_inline(pause, _pause_doc)
)
_record_doc = make_dict_unstructure_fn(ToolCallRecord, converter, _cattrs_omit_if_default=True)
_record_of = make_dict_structure_fn(ToolCallRecord, converter, _cattrs_forbid_extra_keys=True)
converter.register_unstructure_hook(
    ToolCallRecord, lambda record: hooks.unstructure_record(record, _record_doc(record))
)
converter.register_structure_hook(
    ToolCallRecord, lambda doc, cls: _record_of(hooks.structure_record(doc), cls)
)
_turn_doc = make_dict_unstructure_fn(Turn, converter, _cattrs_omit_if_default=True)
_turn_of = make_dict_structure_fn(Turn, converter, _cattrs_forbid_extra_keys=True)


def _unstructure_turn(turn: Turn) -> dict[str, Any]:
    hooks.turn_calls(turn)
    return _turn_doc(turn)


def _structure_turn(doc: Any, cls: Any) -> Turn:
    hooks.turn_calls(None)
    return _turn_of(doc, cls)


converter.register_unstructure_hook(Turn, _unstructure_turn)
converter.register_structure_hook(Turn, _structure_turn)
_run_doc = make_dict_unstructure_fn(
    Run, converter, _cattrs_omit_if_default=True, schema_version=override(omit_if_default=False)
)
_head_doc = make_dict_unstructure_fn(
    Run,
    converter,
    _cattrs_omit_if_default=True,
    schema_version=override(omit_if_default=False),
    revision=override(omit_if_default=False),
    state=override(omit_if_default=False),
    created_at=override(omit_if_default=False),
    updated_at=override(omit_if_default=False),
    messages=override(omit=True),
    turns=override(omit=True),
)
converter.register_unstructure_hook(Run, _run_doc)


def unstructure_head(run: Run) -> dict[str, Any]:
    """A run without its transcript and completed turns: what a store's head holds
    (its revision, state and times always, so a listing reads them off the head)."""
    return _head_doc(run)


Migration = Callable[[str, Any], Any]
"""``fn(kind, doc)``: a stored document at one schema version, as it is at the next.

``kind`` says what the document is: ``"head"`` (a run head as the stores keep it:
the run's document without ``messages`` and ``turns``; its ``revision``,
``schema_version``, ``"$m"`` and ``"$t"`` are the store's and stay as they are),
``"message"``, ``"turn"`` (a completed turn, or the current turn of a head) or
``"run"`` (a whole run as ``unstructure`` gives it). Documents are the converter's:
field names as in the records, defaults left out; in a store's documents a long
string may be ``{"$b": key}`` and a request's messages a reference (see
``statekernel._records.storing``). ``fn`` may change ``doc`` in place and return it.
"""

_MIGRATIONS: dict[int, Migration] = {}


def register_migration(from_version: int, fn: Migration) -> None:
    """Register ``fn`` to upgrade stored documents from ``from_version`` to the next version.

    Stores run migrations on the stored documents before they are structured, and the
    first commit after loading a run stored at an older version writes every record
    the run still needs again at the current version (``statekernel.stores._format.codec``).
    """
    _MIGRATIONS[from_version] = fn


register_migration(1, from_v1)


def check_version(version: Any, *, what: str = "run") -> int:
    """A stored ``schema_version`` this release reads (the current one, or one that
    registered migrations upgrade); else ``CorruptCheckpoint``."""
    known = type(version) is int and version <= SCHEMA_VERSION
    if not known or (version < 1 and version not in _MIGRATIONS):
        raise CorruptCheckpoint(f"invalid {what}: unknown schema_version {version!r}")
    for step in range(version, SCHEMA_VERSION):
        if step not in _MIGRATIONS:
            raise CorruptCheckpoint(f"invalid {what}: no migration from schema_version {step}")
    return int(version)


def migrate(kind: str, doc: Any, version: int, *, what: str = "run") -> Any:
    """A stored document of ``kind`` at ``version``, upgraded to the current version."""
    while version < SCHEMA_VERSION:
        fn = _MIGRATIONS.get(version)
        if fn is None:
            raise CorruptCheckpoint(f"invalid {what}: no migration from schema_version {version}")
        try:
            doc = fn(kind, doc)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            detail = f"{type(exc).__name__}: {exc}"
            raise CorruptCheckpoint(
                f"invalid {what}: migration from schema_version {version} failed: {detail}"
            ) from exc
        version += 1
    return doc


def unstructure(obj: Any) -> Any:
    """A record as JSON-able data."""
    return converter.unstructure(obj)


def to_plain(value: Any) -> Any:
    """A record (or a list, tuple or dict of them) as plain JSON-ready data with every
    field present, also those the stored form leaves out at their default: what
    ``statekernel runs show --json`` prints."""
    if attrs.has(type(value)):
        return _filled(unstructure(value), value)
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def _filled(data: Any, value: Any) -> Any:
    """``data`` with the fields the stored form leaves out at their default put back
    (and a pause's ``metadata``, the JSON view of its details)."""
    if attrs.has(type(value)) and isinstance(data, dict):
        for f in attrs.fields(type(value)):
            field_value = getattr(value, f.name)
            if f.name in data:
                data[f.name] = _filled(data[f.name], field_value)
            else:
                data[f.name] = _filled(unstructure(field_value), field_value)
        if isinstance(value, PauseInfo):  # what scripts read: the details as JSON
            data["metadata"] = value.metadata
    elif isinstance(value, list | tuple) and isinstance(data, list):
        return [_filled(d, v) for d, v in zip(data, value, strict=False)]
    return data


def structure(data: Any, cls: type[T], *, what: str = "record") -> T:
    """Data back into a record; any mismatch raises ``CorruptCheckpoint``."""
    try:
        return converter.structure(data, cls)
    except Exception as exc:
        detail = "; ".join(cattrs.transform_error(exc)) if isinstance(exc, Exception) else ""
        raise CorruptCheckpoint(f"invalid {what}: {detail or exc}") from exc


def upgrade(data: Any, *, what: str = "run") -> dict[str, Any]:
    """Check ``schema_version`` of unstructured run data and apply registered migrations."""
    if not isinstance(data, dict):
        raise CorruptCheckpoint(f"invalid {what}: expected an object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise CorruptCheckpoint(f"invalid {what}: no schema_version")
    version = check_version(version, what=what)
    data = migrate("run", dict(data), version, what=what)
    if not isinstance(data, dict):
        raise CorruptCheckpoint(f"invalid {what}: a migration did not give an object")
    data["schema_version"] = SCHEMA_VERSION
    return data


def structure_run(data: Any, *, what: str = "run") -> Run:
    """Stored run data (any known schema version) back into a ``Run``."""
    return structure(upgrade(data, what=what), Run, what=what)


def dumps(obj: Any) -> str:
    """A record as compact JSON text."""
    return json.dumps(unstructure(obj), separators=(",", ":"), ensure_ascii=False)


def loads(text: str | bytes, cls: type[T], *, what: str = "record") -> T:
    """JSON text back into a record; bad JSON or data raises ``CorruptCheckpoint``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CorruptCheckpoint(f"invalid {what}: not JSON ({exc})") from exc
    if cls is Run:
        return structure_run(data, what=what)  # type: ignore[return-value]
    return structure(data, cls, what=what)
