"""A question's answer form, generated from the question's JSON schema, and the answer
read back from the submitted form and validated against that schema before it is sent.

Scalars get an input of their kind (text, number, checkbox, a choice for ``enum``); an
object with ``properties`` gets one such input per property; anything else (arrays,
combinations, no schema) gets a JSON text area, whose text is taken as a string when it
is not JSON (as ``statekernel runs resume --value`` takes it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import jsonschema

from statekernel.errors import InvalidArgument
from statekernel.web.numbers import decimal_number, signed_number

__all__ = ["Field", "answer_fields", "read_answer"]

JSON_SCHEMA = Any
"""A JSON schema (a mapping), or None for any JSON value."""

VALUE = "value"
"""The form field of a scalar (or JSON) answer; an object's properties are ``f.NAME``."""


@attrs.frozen
class Field:
    """One input of an answer form."""

    name: str
    label: str
    kind: str  # text, integer, number, boolean, choice, json
    required: bool = True
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    description: str = ""


def _kind(schema: Mapping[str, Any]) -> str:
    if "enum" in schema and all(isinstance(v, str | int | float) for v in schema["enum"]):
        return "choice"
    kind = schema.get("type")
    return kind if kind in ("string", "integer", "number", "boolean") else "json"


def _field(name: str, label: str, schema: Any, required: bool) -> Field:
    if not isinstance(schema, Mapping):
        return Field(name, label, "json", required)
    kind = _kind(schema)
    return Field(
        name,
        label,
        "text" if kind == "string" else kind,
        required,
        tuple(json.dumps(v) for v in schema.get("enum", ())) if kind == "choice" else (),
        schema.get("minimum"),
        schema.get("maximum"),
        str(schema.get("description", "")),
    )


def _properties(schema: JSON_SCHEMA) -> Mapping[str, Any] | None:
    if isinstance(schema, Mapping) and schema.get("type") == "object":
        props = schema.get("properties")
        if isinstance(props, Mapping) and props:
            return props
    return None


def answer_fields(schema: JSON_SCHEMA) -> list[Field]:
    """The inputs of the form answering a question with ``schema`` (None: any JSON)."""
    props = _properties(schema)
    if props is None:
        return [_field(VALUE, "answer", schema, True)]
    required = set(schema.get("required", ()))
    return [_field(f"f.{k}", k, v, k in required) for k, v in props.items()]


def _value(field: Field, form: Mapping[str, str]) -> tuple[bool, Any]:
    """(given, value) of one field."""
    if field.kind == "boolean":
        return True, form.get(field.name) in ("on", "true", "1")
    if field.name not in form:
        return False, None
    text = form[field.name]
    if text == "" and not (field.required and field.kind == "text"):
        return False, None  # an empty input of a number, a choice, JSON: not given
    if field.kind == "integer":
        return True, signed_number(text, field.label)
    if field.kind == "number":
        number = decimal_number(text, field.label)
        return True, int(number) if number.is_integer() and "." not in text else number
    if field.kind == "choice":
        try:
            return True, json.loads(text)
        except ValueError:
            raise InvalidArgument(f"{field.label}: {text!r} is not one of the choices") from None
    if field.kind == "json":
        try:
            return True, json.loads(text)
        except ValueError:
            return True, text
    return True, text


def read_answer(schema: JSON_SCHEMA, form: Mapping[str, str]) -> Any:
    """The answer a submitted form gives, validated against ``schema``:
    ``InvalidArgument`` naming what is wrong otherwise."""
    fields = answer_fields(schema)
    if _properties(schema) is None:
        given, value = _value(fields[0], form)
        if not given:
            raise InvalidArgument("the answer is empty")
    else:
        value = {}
        for field in fields:
            given, one = _value(field, form)
            if given:
                value[field.label] = one
    if schema is not None:
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as exc:
            raise InvalidArgument(f"the answer does not fit the question: {exc.message}") from None
        except jsonschema.SchemaError as exc:
            raise InvalidArgument(f"the question's schema is invalid: {exc.message}") from None
    return value
