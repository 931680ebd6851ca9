"""Tool parameters that pydantic describes and checks, when pydantic is installed (the
``pydantic`` extra): pydantic models, ``TypedDict``s, dataclasses, ``datetime``, ``UUID``,
``Annotated[..., Field(...)]`` and any other type pydantic's ``TypeAdapter`` accepts.

Arguments are JSON: they are checked in pydantic's strict mode on their JSON text, so
``"3"`` is no integer and ``"false"`` no boolean, while an ISO 8601 string is a
``datetime`` and an object a model, as JSON can carry them and nothing more.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from typing import Annotated, Any, get_args, get_origin

import orjson

__all__ = ["INSTALL_HINT", "adapter_for", "check", "jsonable", "schemas", "without_extras"]

INSTALL_HINT = "install pydantic (pip install 'statekernel[pydantic]') to use it"


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("pydantic") is not None


def adapter_for(tp: Any) -> tuple[Any, str]:
    """A pydantic ``TypeAdapter`` of ``tp`` and ``""``, or None and why there is none."""
    if not _installed():
        return None, INSTALL_HINT
    import pydantic

    try:
        adapter = pydantic.TypeAdapter(tp)
        adapter.json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
        return None, f"pydantic cannot use it: {str(exc).splitlines()[0]}"
    return adapter, ""


def schemas(adapters: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The JSON schema of each adapter's type, and the definitions (``$defs``) that their
    ``$ref``s point to from the root of the schema they go into."""
    if not adapters:
        return {}, {}
    import pydantic

    keyed, defs = pydantic.TypeAdapter.json_schemas(
        [(name, "validation", adapter) for name, adapter in adapters.items()]
    )
    return {name: keyed[(name, "validation")] for name in adapters}, defs.get("$defs", {})


def check(adapter: Any, name: str, value: Any) -> tuple[Any, list[str]]:
    """``value`` (JSON) as the type of ``adapter``, strictly, and no problems; or None and
    the problems, each ending with where it is (``@ $.name[0].field``)."""
    import pydantic

    try:
        return adapter.validate_json(orjson.dumps(value), strict=True), []
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
            problems.append(f"{error['msg']} @ $.{name}{where}")
        return None, problems


def jsonable(value: Any) -> Any:
    """``value`` with what pydantic knows how to write as JSON (models, dataclasses,
    datetimes, UUIDs...) written so; ``value`` unchanged without pydantic or when pydantic
    cannot."""
    if not _installed():
        return value
    import pydantic_core

    try:
        return pydantic_core.to_jsonable_python(value)
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
        return value


def without_extras(tp: Any) -> Any:
    """``tp`` without its ``Annotated`` wrapper (at the top), if it has one."""
    if get_origin(tp) is Annotated:
        return get_args(tp)[0]
    return tp
