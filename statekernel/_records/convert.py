"""The plain converter: records to JSON-able data and back, with schema migrations.

``converter`` turns every record into plain data (``unstructure``, ``dumps``, what
``statekernel runs show --json`` prints) and back (``structure``, ``loads``): field
names as in the records, defaults left out, ISO times, content parts and pause
details tagged by kind. A store's bytes are made by another converter, built the
same way with the stored format's hooks for strings, JSON values and times first
(``statekernel.stores._format.converter``): ``configure_converter`` is the part they
share, as ``cattrs.preconf`` builds its converters.
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

from statekernel._records.fallback import Fallback
from statekernel._records.lazy import LazyTuple
from statekernel._records.messages import (
    ContentPart,
    ImagePart,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
)
from statekernel._records.pauses import (
    ChildWait,
    HookPause,
    LimitReached,
    MaxTurns,
    PauseDetails,
    Question,
    Rerun,
    Resolution,
    ResolvedError,
    ResolvedOutput,
    Uncertain,
)
from statekernel._records.run import SCHEMA_VERSION, PauseInfo, Run
from statekernel._records.upgrade_v1 import from_v1
from statekernel.errors import CorruptCheckpoint

__all__ = [
    "SCHEMA_VERSION",
    "Migration",
    "check_version",
    "configure_converter",
    "converter",
    "dumps",
    "loads",
    "make_converter",
    "migrate",
    "register_migration",
    "structure",
    "structure_run",
    "to_plain",
    "unstructure",
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
_PAUSE_TAGS: dict[type, str] = {
    Uncertain: "uncertain",
    Question: "question",
    ChildWait: "child",
    MaxTurns: "max_turns",
    LimitReached: "limit",
    HookPause: "hook",
}
_RESOLUTION_TAGS: dict[type, str] = {
    ResolvedOutput: "output",
    ResolvedError: "error",
    Rerun: "rerun",
}


def configure_converter(converter: cattrs.Converter) -> None:
    """Teach ``converter`` the shapes of the records: content parts, resolutions and
    pause details tagged by kind, ``LazyTuple`` fields as lists, a run's
    ``schema_version`` always written.

    The hooks for strings, numbers, JSON values (``Any``) and times must be registered
    first: the generated functions of the records call the hooks registered when they
    are made. Those of whole records are made when first used, so hooks registered
    after this call for a record (the stored format's, for a request or a turn) are
    the ones a run's function calls.
    """
    converter.register_structure_hook_func(lambda t: t == int | float, _structure_number)
    for union, tags, name in (
        (ContentPart, _PART_TAGS, "type"),
        (Resolution, _RESOLUTION_TAGS, "kind"),
        (PauseDetails, _PAUSE_TAGS, "kind"),
    ):
        configure_tagged_union(union, converter, tag_generator=tags.__getitem__, tag_name=name)

    def structure_lazy_tuple(cls: Any) -> Callable[[Any, Any], LazyTuple[Any]]:
        (item,) = get_args(cls) or (Any,)
        items = tuple[item, ...]  # type: ignore[valid-type]
        hook = converter.get_structure_hook(items)
        return lambda value, _: LazyTuple(hook(value, items))

    converter.register_unstructure_hook_func(
        _is_lazy_tuple, lambda value: [converter.unstructure(item) for item in value]
    )
    converter.register_structure_hook_factory(_is_lazy_tuple, structure_lazy_tuple)
    converter.register_structure_hook(Fallback, _fallback_of(converter))
    converter.register_unstructure_hook_factory(
        lambda cls: cls is Run,
        lambda _: make_dict_unstructure_fn(
            Run,
            converter,
            _cattrs_omit_if_default=True,
            schema_version=override(omit_if_default=False),
        ),
    )


def _fallback_of(converter: cattrs.Converter) -> Callable[[Any, Any], Fallback]:
    """A ``Fallback``'s structure hook (its constructor takes the models positionally):
    ``{"models": [...], "on": [...]}``, ``on`` left out at its default."""

    def structure(doc: Any, _: Any) -> Fallback:
        if type(doc) is not dict or "models" not in doc or not set(doc) <= {"models", "on"}:
            raise ValueError(f"expected a fallback chain's models and on, got {doc!r:.200}")
        models = converter.structure(doc["models"], tuple[str, ...])
        if "on" not in doc:
            return Fallback(*models)
        return Fallback(*models, on=converter.structure(doc["on"], tuple[str, ...]))  # type: ignore[arg-type]

    return structure


def _is_lazy_tuple(cls: Any) -> bool:
    return cls is LazyTuple or get_origin(cls) is LazyTuple


def _structure_str(value: Any, _: Any) -> str:
    return value if type(value) is str else str(value)


def _lenient(kind: type) -> Callable[[Any, Any], Any]:
    """Structure ``kind`` (int, bool, float): itself (an int for a float), else converted."""

    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            return value
        return kind(value)

    return structure


def _structure_number(value: Any, _: Any) -> int | float:
    """An ``int | float`` (a limit's figure): an int or a float as it is, else an error
    (a bool, a string and None are not figures)."""
    if type(value) in (int, float):
        return value  # type: ignore[no-any-return]
    raise TypeError(f"expected a number, got {type(value).__name__}")


def _structure_time(value: Any, _: Any) -> datetime:
    if type(value) is not str:
        raise TypeError(f"expected an ISO datetime string, got {type(value).__name__}")
    return datetime.fromisoformat(value)


def make_converter() -> cattrs.Converter:
    """A new plain converter (what ``converter`` is): times as ISO text, strings and
    JSON values as they are, numbers converted where they can be."""
    made = cattrs.Converter(omit_if_default=True, forbid_extra_keys=True)
    made.register_structure_hook(str, _structure_str)
    for kind in (int, bool, float):
        made.register_structure_hook(kind, _lenient(kind))
    made.register_unstructure_hook(datetime, datetime.isoformat)
    made.register_structure_hook(datetime, _structure_time)
    made.register_unstructure_hook_func(lambda t: t is Any, lambda value: value)
    made.register_structure_hook_func(lambda t: t is Any, lambda value, _: value)
    configure_converter(made)
    made.register_structure_hook_factory(lambda cls: cls is ModelRequest, _request_of(made))
    return made


def _request_of(converter: cattrs.Converter) -> Callable[[Any], Any]:
    """A request's structure hook: its messages must be a list (a store's converter has
    its own, which also reads references into the message log)."""

    def factory(_: Any) -> Any:
        message = converter.get_structure_hook(Message)

        def messages(value: Any, _: Any) -> LazyTuple[Message]:
            if type(value) is not list:
                raise TypeError("expected a list of messages")
            return LazyTuple([message(m, Message) for m in value])

        return make_dict_structure_fn(
            ModelRequest, converter, messages=override(struct_hook=messages)
        )

    return factory


converter = make_converter()
"""The plain converter: records to plain data and back."""


Migration = Callable[[str, Any], Any]
"""``fn(kind, doc)``: a stored document at one schema version, as it is at the next.

``kind`` says what the document is: ``"head"`` (a run head as the stores keep it:
the run's document without ``messages`` and ``turns``; its ``revision``,
``schema_version``, ``"$m"`` and ``"$t"`` are the store's and stay as they are),
``"message"``, ``"turn"`` (a completed turn, or the current turn of a head) or
``"run"`` (a whole run as ``unstructure`` gives it). Documents are the converters':
field names as in the records, defaults left out; in a store's documents a long
string may be ``{"$b": key}`` and a request's messages a reference (see
``statekernel.stores._format.converter``). ``fn`` may change ``doc`` in place and
return it.
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
    registered migrations upgrade); else ``CorruptCheckpoint``, which names both
    versions when the stored one is newer (a newer release wrote it)."""
    if type(version) is int and version > SCHEMA_VERSION:
        raise CorruptCheckpoint(
            f"invalid {what}: unknown schema_version {version}, newer than {SCHEMA_VERSION}"
            " (the newest this release reads): a newer statekernel wrote it; upgrade to read it"
        )
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
    ``statekernel runs show --json`` prints.

    Returns:
        The plain data; a value that is no record, list, tuple or dict as it is.
    """
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
