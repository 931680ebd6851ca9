"""JSON schemas from Python type hints, strict argument structuring with cattrs, and
the check of a declared JSON Schema.

Model output is data: arguments are parsed JSON, checked against the annotations
(no coercion of ``"3"`` to ``3`` or ``"false"`` to ``True``), never evaluated. A
schema that checks values (a tool's parameters, a question's answer) is checked when
it is declared (``schema_problem``), so that checking a value later never fails for a
reason of the schema's own.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

import attrs
import cattrs
import docstring_parser

from statekernel._records.values import as_stored

if TYPE_CHECKING:
    import referencing

# jsonschema and referencing are imported where a schema is first checked: they take a
# quarter of the import of statekernel, which a command that only reads a store never needs.

__all__ = [
    "parse_docstring",
    "schema_for",
    "schema_problem",
    "schema_violation",
    "strict_converter",
]

_PRIMITIVES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def schema_for(tp: Any) -> dict[str, Any]:
    """The JSON schema of a type hint."""
    if tp is Any or tp is inspect.Parameter.empty:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [schema_for(a) for a in args]
        return {"anyOf": options}
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [schema_for(a) for a in args]
        size = len(items)
        return {"type": "array", "prefixItems": items, "minItems": size, "maxItems": size}
    if origin in (list, Sequence, tuple, set, frozenset) or tp in (list, tuple):
        item = args[0] if args else Any
        return {"type": "array", "items": schema_for(item)}
    if origin in (dict, Mapping) or tp is dict:
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": schema_for(value)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if attrs.has(tp):
        hints = typing.get_type_hints(tp)
        fields = attrs.fields(tp)
        return {
            "type": "object",
            "properties": {f.name: schema_for(hints.get(f.name, Any)) for f in fields},
            "required": [f.name for f in fields if f.default is attrs.NOTHING],
            "additionalProperties": False,
        }
    raise TypeError(f"no JSON schema for type {tp!r}")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str], str]:
    """The description and the parameter descriptions of a docstring in Google
    (``Args:``), NumPy (``Parameters``) or Sphinx (``:param x:``) style, and the name of
    the section that describes parameters in its style (for messages). Lines are joined
    with single spaces."""
    parsed = docstring_parser.parse(doc or "", docstring_parser.DocstringStyle.AUTO)
    texts = (parsed.short_description, parsed.long_description)
    description = _joined(" ".join(t for t in texts if t))
    params = {
        p.arg_name.lstrip("*"): _joined(p.description or "")
        for p in parsed.params
        if p.args and p.args[0] == "param"
    }
    section = _SECTIONS.get(parsed.style, "Args:") if parsed.style else "Args:"
    return description, params, section


_SECTIONS = {
    docstring_parser.DocstringStyle.GOOGLE: "Args:",
    docstring_parser.DocstringStyle.NUMPYDOC: "Parameters",
    docstring_parser.DocstringStyle.REST: ":param",
    docstring_parser.DocstringStyle.EPYDOC: "@param",
}


def _joined(text: str) -> str:
    return " ".join(text.split())


def _strict(kind: type | tuple[type, ...], label: str) -> Any:
    def hook(value: Any, _: Any) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise TypeError(f"expected {label}, got a boolean")
        if not isinstance(value, kind):
            raise TypeError(f"expected {label}, got {type(value).__name__}")
        return float(value) if label == "number" else value  # type: ignore[arg-type]

    return hook


def _is_sequence(tp: Any) -> bool:
    return get_origin(tp) in (list, Sequence, tuple, set, frozenset)


def strict_converter() -> cattrs.Converter:
    """A converter that structures JSON into annotated types without coercion."""
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(str, _strict(str, "string"))
    conv.register_structure_hook(int, _strict(int, "integer"))
    conv.register_structure_hook(float, _strict((int, float), "number"))
    conv.register_structure_hook(bool, _strict(bool, "boolean"))
    conv.register_structure_hook(Any, lambda v, _: v)

    def sequence_hook(tp: Any) -> Any:
        args = get_args(tp)
        item = args[0] if args else Any
        origin = get_origin(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return fixed_tuple_hook(args)

        def hook(value: Any, _: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected array, got {type(value).__name__}")
            items = [conv.structure(v, item) for v in value]
            if origin is tuple:
                return tuple(items)
            return set(items) if origin in (set, frozenset) else items

        return hook

    def fixed_tuple_hook(items: tuple[Any, ...]) -> Any:
        def hook(value: Any, _: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected array, got {type(value).__name__}")
            if len(value) != len(items):
                raise ValueError(f"expected an array of {len(items)} items, got {len(value)}")
            return tuple(conv.structure(v, t) for v, t in zip(value, items, strict=True))

        return hook

    conv.register_structure_hook_factory(_is_sequence, sequence_hook)
    return conv


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot check values, or None if it can: it must be a JSON object,
    valid JSON Schema for its dialect (``$schema``, default 2020-12), and every ``$ref``
    in it must resolve within it (or to a dialect's metaschema: nothing is fetched)."""
    if not isinstance(schema, Mapping):
        return f"not a JSON object: {schema!r}"[:300]
    stored, problem = as_stored(schema, "schema")
    if problem is not None:
        return f"not JSON: {problem}"
    try:
        text = json.dumps(stored, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):  # checked as it is: the check names the problem
        return _problem(stored)
    if len(text) > _CACHED_UP_TO:
        return _problem(stored)
    return _cached_problem(text)


_CACHED_UP_TO = 64 * 1024
"""The longest schema (as JSON text) whose check is remembered."""


@functools.lru_cache(maxsize=512)
def _cached_problem(text: str) -> str | None:
    """``_problem`` of the schema ``text`` holds, checked once per process: a kernel
    built again and again (one per request, one per test case) checks its tools'
    schemas once. Measured: half the CPU of the crash/resume fuzzing went to checking
    the same few schemas against their metaschema."""
    return _problem(json.loads(text))


def _problem(stored: dict[str, Any]) -> str | None:
    import jsonschema
    import referencing.jsonschema
    from jsonschema_specifications import REGISTRY as metaschemas

    cls = jsonschema.validators.validator_for(stored)
    try:
        cls.check_schema(stored)
    except jsonschema.SchemaError as error:
        where = "".join(f"[{p!r}]" for p in error.absolute_path)
        return f"not a valid JSON Schema: schema{where}: {error.message}"
    dialect = str(cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id") or "")
    spec = referencing.jsonschema.specification_with(
        dialect, default=referencing.jsonschema.DRAFT202012
    )
    root = spec.create_resource(stored)
    try:
        problem = _unresolved(root, metaschemas.resolver_with_root(root))
    except RecursionError:
        problem = "nested too deeply"
    if problem is not None:
        return problem
    try:
        _validator(stored).is_valid({})
    except Exception as exc:  # e.g. a $ref cycle that never reaches a value
        return f"unusable: checking a value raised {type(exc).__name__}: {exc}"[:300]
    return None


def _unresolved(resource: referencing.Resource[Any], resolver: Any) -> str | None:
    """The first ``$ref`` in ``resource`` or its subschemas that resolves nowhere."""
    import referencing.exceptions

    resolver = resolver.in_subresource(resource)
    contents = resource.contents
    ref = contents.get("$ref") if isinstance(contents, Mapping) else None
    if isinstance(ref, str):
        seen = [contents]
        try:
            resolved = resolver.lookup(ref)
            while isinstance(resolved.contents, Mapping) and "$ref" in resolved.contents:
                if any(resolved.contents is s for s in seen):
                    return f"its $ref {ref!r} refers back to itself before checking anything"
                seen.append(resolved.contents)
                resolved = resolved.resolver.lookup(str(resolved.contents["$ref"]))
        except referencing.exceptions.Unresolvable as exc:
            return f"its $ref {ref!r} resolves nowhere ({type(exc).__name__})"
    for sub in resource.subresources():
        problem = _unresolved(sub, resolver)
        if problem is not None:
            return problem
    return None


def _validator(schema: Mapping[str, Any]) -> Any:
    """A validator of ``schema`` that resolves ``$ref`` within it and to the dialects'
    metaschemas only (a remote document is never fetched)."""
    import jsonschema
    import referencing

    return jsonschema.validators.validator_for(schema)(schema, registry=referencing.Registry())


def schema_violation(schema: Mapping[str, Any], value: Any) -> tuple[str, str] | None:
    """Where and how ``value`` breaks the JSON Schema ``schema`` (the most relevant error,
    its path as ``['key'][0]``), or None if it satisfies it. A schema that cannot be
    applied (see ``schema_problem``) is a violation saying so, never an exception."""
    import jsonschema.exceptions

    try:
        error = jsonschema.exceptions.best_match(_validator(schema).iter_errors(value))
    except Exception as exc:  # a $ref that resolves nowhere, a cycle, a bad pattern
        return "", f"the schema cannot be applied ({type(exc).__name__}: {exc})"[:300]
    except BaseException as exc:
        if not _panicked(exc):
            raise
        # a cycle whose recursion limit is reached inside the Rust maps referencing keeps
        # its resources in (rpds): it comes out of their __eq__ as a pyo3 panic
        return "", f"the schema cannot be applied ({type(exc).__name__}: a cycle)"
    if error is None:
        return None
    return "".join(f"[{p!r}]" for p in error.absolute_path), error.message


def _panicked(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic a pyo3 extension raised (``PanicException``, which
    derives from ``BaseException`` and cannot be imported by name)."""
    return type(exc).__name__ == "PanicException"
