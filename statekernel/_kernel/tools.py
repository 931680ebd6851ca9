"""``@statekernel.tool``: typed Python functions as tools the model can call."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, overload

import attrs
import cattrs

from statekernel._kernel import typed
from statekernel._kernel.schema import (
    parse_docstring,
    schema_for,
    schema_problem,
    schema_violation,
    strict_converter,
)
from statekernel._records.arguments import flag, seconds
from statekernel._records.convert import converter as record_converter
from statekernel._records.messages import JSON, ToolSpec
from statekernel._records.values import as_stored
from statekernel._storage.shielding import wait_ended
from statekernel.errors import ConfigError, InvalidArgument, ToolError

__all__ = ["SchemaTool", "Tool", "ToolContext", "ToolReturn", "UnstorableResult", "tool"]

_ARGS = strict_converter()


@attrs.frozen
class ToolContext:
    """What a tool may know about the call it serves (add a ``ctx: ToolContext`` parameter).

    ``idempotency_key`` is ``f"{run_id}:{call_id}"``: the same on every attempt of one
    call, so an idempotent tool can pass it to the service it calls. ``fencing_token``
    orders the owners of the run: pass it where a service can refuse a stale owner.
    """

    run_id: str
    call_id: str
    attempt: int
    context: JSON
    report: Callable[[JSON], None] = attrs.field(repr=False, default=lambda _: None)
    kernel: Any = attrs.field(repr=False, default=None)
    """The ``Kernel`` driving the call (None outside a kernel): its store and providers."""
    fencing_token: int | None = None
    """The fencing token of the run's lease under which this call started (None outside
    a kernel). The tokens of one run only grow: a service that remembers the largest token
    it has seen for the run and refuses a smaller one cannot be reached by an owner that
    lost the run while it was stalled (see README, "Ownership")."""
    tags: Mapping[str, str] = attrs.field(factory=dict)
    """The run's tags when the call started (a copy: ``Kernel.update_tags`` changes them)."""

    @property
    def idempotency_key(self) -> str:
        """A key stable across re-runs of this call."""
        return f"{self.run_id}:{self.call_id}"


@attrs.frozen
class ToolReturn:
    """A tool's result with a change to the run's context.

    Return ``ToolReturn(output, context={...})`` from a tool: ``output`` is the result
    the model sees; ``context`` is a JSON Merge Patch (RFC 7396: keys set, nested
    objects merged, ``None`` removes a key) committed with the result, in the same
    commit, and applied to ``run.context`` when every call of the turn has completed,
    in the order the model made the calls, whatever order they finished in. The next
    turn's hooks (from ``on_turn_prepared`` on) see the patched context.
    """

    output: JSON = None
    context: JSON = None


@attrs.frozen
class Tool:
    """A callable tool: its spec for the model, its validator and its dispatch flags."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = attrs.field(repr=False)
    arguments_type: type = attrs.field(repr=False)
    context_param: str | None = None
    idempotent: bool = False
    concurrency_safe: bool = True
    timeout: float | None = None
    inline: bool = attrs.field(default=False, kw_only=True)
    typed_parameters: Mapping[str, Any] = attrs.field(factory=dict, kw_only=True, repr=False)
    """Parameters that pydantic checks: their names and ``TypeAdapter``s (the
    ``arguments_type`` holds them as ``Any``)."""

    def __attrs_post_init__(self) -> None:
        try:  # every way of making a tool (decorator, adapters, MCP) comes through here
            flag("idempotent", self.idempotent)
            flag("concurrency_safe", self.concurrency_safe)
            flag("inline", self.inline)
            if self.timeout is not None:
                seconds("timeout", self.timeout)
        except InvalidArgument as exc:
            raise ConfigError(f"tool {self.name!r}: {exc}") from None
        if self.inline and self.timeout is not None:
            raise ConfigError(
                f"tool {self.name!r}: an inline tool runs on the event loop and cannot time out"
            )

    @property
    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, arguments: JSON) -> dict[str, Any]:
        """Check and structure the model's arguments; raises ``ToolError`` explaining why not.

        Returns:
            The arguments by parameter name, as the function receives them (attrs
                records, enums, and pydantic's types for the parameters pydantic checks).

        Raises:
            ToolError: ``arguments`` is not a JSON object or does not fit the parameters.
        """
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments for {self.name} must be a JSON object")
        try:
            structured: Any = _ARGS.structure(arguments, self.arguments_type)
        except cattrs.BaseValidationError as exc:
            problems = "; ".join(cattrs.transform_error(exc))
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from exc
        except (TypeError, ValueError) as exc:
            raise ToolError(f"invalid arguments for {self.name}: {exc}") from exc
        values = {f.name: getattr(structured, f.name) for f in attrs.fields(self.arguments_type)}
        refused: list[str] = []
        for pname, adapter in self.typed_parameters.items():
            if pname in arguments:
                values[pname], found = typed.check(adapter, pname, arguments[pname])
                refused.extend(found)
        if refused:
            raise ToolError(f"invalid arguments for {self.name}: {'; '.join(refused)}")
        return values

    async def invoke(self, arguments: JSON, ctx: ToolContext) -> JSON:
        """Validate, call (with ``timeout``) and return JSON-able output (a
        ``ToolReturn`` of JSON-able parts when the tool returned one).

        A sync function runs in a thread of the loop's default executor, or on the
        event loop itself when the tool is ``inline``. Cancelling the call then waits
        for the thread to return (a thread cannot be stopped), so a cancelled call has
        always ended. A timeout does not wait: the thread may go on and its result is
        dropped.

        Returns:
            The function's result as JSON, or a ``ToolReturn`` of JSON output and a JSON
                object context patch when the function returned one.

        Raises:
            ToolError: the arguments are invalid (see ``validate``), the call timed out,
                or it returned something that is not JSON (or a context patch that is
                not a JSON object). An exception the function raises propagates as it is.
        """
        kwargs = self.validate(arguments)
        if self.context_param:
            kwargs[self.context_param] = ctx
        if _is_async(self.fn):
            result = await self._awaited(self.fn(**kwargs))
        elif self.inline:
            result = self.fn(**kwargs)
            if inspect.isawaitable(result):
                result = await self._awaited(result)
        else:
            result = await self._in_thread(kwargs)
            if inspect.isawaitable(result):
                result = await self._awaited(result)
        if isinstance(result, ToolReturn):
            return ToolReturn(_jsonable(self.name, result.output), _patch(self.name, result))
        return _jsonable(self.name, result)

    async def _awaited(self, result: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout):
                return await result
        except TimeoutError as exc:
            raise self._timed_out() from exc

    async def _in_thread(self, kwargs: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, self.fn, **kwargs)
        future = loop.run_in_executor(None, call)
        future.add_done_callback(_retrieve)
        try:
            done, _ = await asyncio.wait({future}, timeout=self.timeout)
        except asyncio.CancelledError:
            await wait_ended([future])
            raise
        if not done:
            raise self._timed_out()
        return future.result()

    def _timed_out(self) -> ToolError:
        """The error of a call that did not finish in time: a non-idempotent call may
        have had its effect (or may still have it), and the words must say so."""
        if self.idempotent:
            return ToolError(f"{self.name} timed out after {self.timeout} s")
        return ToolError(
            f"outcome unknown: {self.name} timed out after {self.timeout} s; it may have run"
        )


@attrs.frozen
class SchemaTool(Tool):
    """A tool described by a JSON Schema of its own (an MCP server's, another library's):
    arguments are checked against ``parameters`` and handed to ``fn`` as given (JSON)."""

    def validate(self, arguments: JSON) -> dict[str, Any]:
        """The arguments as given, if they satisfy the tool's schema; else ``ToolError``."""
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments for {self.name} must be a JSON object")
        violation = schema_violation(self.parameters, arguments)
        if violation is not None:
            where, why = violation
            raise ToolError(f"invalid arguments for {self.name}{where}: {why}")
        return dict(arguments)


def _is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark the outcome of a thread nobody waits for any more as seen."""
    if not future.cancelled():
        future.exception()


class UnstorableResult(ToolError):
    """The tool's function returned, but its value cannot be stored (not JSON, or a
    context patch that is not a JSON object): the call ran, its output is unknown to
    the store. ``returned`` names the type of the value that could not be stored."""

    def __init__(self, message: str, returned: str) -> None:
        self.returned = returned
        super().__init__(message)


def _jsonable(name: str, value: Any) -> JSON:
    plain = record_converter.unstructure(value)
    stored, problem = as_stored(plain, "output")
    if problem is not None:  # a pydantic model, a datetime...: as pydantic writes them
        stored, problem = as_stored(typed.jsonable(plain), "output")
    if problem is not None:
        returned = type(value).__name__
        raise UnstorableResult(f"{name} returned a value that is not JSON: {problem}", returned)
    return stored


def _patch(name: str, result: ToolReturn) -> JSON:
    patch = result.context
    returned = f"context patch of {type(patch).__name__}"
    if patch is not None and type(patch) is not dict:
        raise UnstorableResult(
            f"{name} returned a context patch that is not a JSON object", returned
        )
    stored, problem = as_stored(patch, "context")
    if problem is not None:
        raise UnstorableResult(
            f"{name} returned a context patch that is not JSON: {problem}", returned
        )
    return stored


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    idempotent: bool,
    concurrency_safe: bool,
    timeout: float | None,
    inline: bool = False,
) -> Tool:
    if name is None and fn.__name__ == "<lambda>":
        raise ConfigError("a tool made from a lambda needs a name: tool(name=...)(lambda ...)")
    what = f"tool {name or fn.__name__!r}"
    hints = typing.get_type_hints(fn, include_extras=True)
    summary, docs, section = parse_docstring(fn.__doc__)
    params = inspect.signature(fn).parameters
    unknown = [p for p in docs if p not in params]
    if unknown:
        raise ConfigError(
            f"tool {name or fn.__name__}: its docstring describes {', '.join(map(repr, unknown))} "
            f"under {section}, which is not a parameter (parameters: {', '.join(params) or 'none'})"
        )
    properties: dict[str, Any] = {}
    required: list[str] = []
    fields: dict[str, Any] = {}
    optional: dict[str, Any] = {}
    adapters: dict[str, Any] = {}
    context_param = None
    for pname, param in params.items():
        hint = hints.get(pname, Any)
        bare = typed.without_extras(hint)
        if ToolContext in (bare, *typing.get_args(bare)):
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        schema, field_type, adapter = _parameter(f"{what}, parameter {pname!r}", hint)
        if adapter is not None:
            adapters[pname] = adapter
        properties[pname] = schema
        if param.default is param.empty:
            required.append(pname)
            fields[pname] = attrs.field(type=field_type)
        else:
            optional[pname] = attrs.field(type=field_type, default=param.default)
    typed_schemas, defs = typed.schemas(adapters)
    properties.update((p, {**properties[p], **s}) for p, s in typed_schemas.items())
    for pname, doc in docs.items():
        if pname in properties and "description" not in properties[pname]:
            properties[pname] = {**properties[pname], "description": doc}
    arguments_type = attrs.make_class(
        f"{fn.__name__}_arguments", {**fields, **optional}, frozen=True
    )
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    parameters["required"] = required
    parameters["additionalProperties"] = False
    if defs:
        parameters["$defs"] = defs
    problem = schema_problem(parameters)
    if problem is not None:
        why = f"the schema of its parameters is {problem}"
        raise ConfigError(f"tool {name or fn.__name__!r}: {why}")
    return Tool(
        name=name or fn.__name__,
        description=description if description is not None else summary,
        parameters=parameters,
        fn=fn,
        arguments_type=arguments_type,
        context_param=context_param,
        idempotent=idempotent,
        concurrency_safe=concurrency_safe,
        timeout=timeout,
        inline=_inline(fn, name, inline, timeout),
        typed_parameters=adapters,
    )


def _parameter(what: str, hint: Any) -> tuple[dict[str, Any], Any, Any]:
    """The JSON schema of a parameter (empty when pydantic gives it), the type its
    arguments field has, and the ``TypeAdapter`` that checks it when pydantic does. The
    types this module describes itself (attrs records, enums, ``Literal``...) stay here;
    the others go to pydantic when it is installed."""
    try:
        return schema_for(hint), hint, None
    except TypeError as exc:
        problem = str(exc)
    adapter, why = typed.adapter_for(hint)
    if adapter is not None:
        return {}, Any, adapter
    bare = typed.without_extras(hint)
    if bare is not hint:  # Annotated[T, ...] without pydantic: T as it is
        try:
            return schema_for(bare), bare, None
        except TypeError as exc:
            problem = str(exc)
    raise ConfigError(f"{what}: {problem}; {why}")


def _inline(fn: Callable[..., Any], name: str | None, inline: object, timeout: object) -> bool:
    """``inline`` as given, for a sync function without a timeout (``ConfigError``
    otherwise: an async function never blocks the loop, and a call on the loop cannot
    be cut off)."""
    what = f"tool {name or fn.__name__!r}"
    if type(inline) is not bool:
        raise ConfigError(f"{what}: inline must be True or False, got {inline!r}")
    if inline and _is_async(fn):
        raise ConfigError(f"{what}: inline is for sync functions (an async one runs on the loop)")
    if inline and timeout is not None:
        raise ConfigError(f"{what}: an inline tool runs on the event loop and cannot time out")
    return inline


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    concurrency_safe: bool = True,
    timeout: float | None = None,
    inline: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    concurrency_safe: bool = True,
    timeout: float | None = None,
    inline: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a (sync or async) function into a ``Tool``.

    The JSON schema comes from the type hints, the description and parameter
    descriptions from the docstring (Google ``Args:``, NumPy ``Parameters`` or Sphinx
    ``:param x:`` style; a ``Field(description=...)`` in ``Annotated`` comes first).
    Parameters may be JSON types, enums, ``Literal``, tuples and attrs records, and with
    pydantic installed (the ``pydantic`` extra) pydantic models, ``TypedDict``s,
    dataclasses, ``datetime``, ``UUID`` and whatever pydantic's ``TypeAdapter`` accepts:
    the model's JSON arguments are checked strictly and the function receives the
    declared types (a model instance, a ``datetime``), while the run stores the JSON.
    ``idempotent`` tools
    are re-run on resume; ``concurrency_safe=False`` tools run alone; ``timeout``
    (seconds) turns a slow call into an error result. A sync function runs in a
    thread, so it never holds up the event loop (and the lease renewals on it);
    ``inline=True`` calls a sync function that is quick and never blocks (no I/O, no
    sleeping) on the loop instead, without the hand-off to a thread.

    Returns:
        The ``Tool`` when ``fn`` is given (``@tool``); without it (``@tool(...)``), a
            decorator that turns a function into one.

    Raises:
        ConfigError: the function cannot be described to a model: a lambda without a
            ``name``, ``*args``/``**kwargs``, a parameter type with no JSON schema, a
            docstring describing a parameter the function lacks, ``inline`` given
            for an async function or together with a ``timeout``, ``idempotent``,
            ``concurrency_safe`` or ``inline`` not a bool, or ``timeout`` not None or a
            number of seconds above 0. With options only, it is raised when the
            decorator is applied.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return _build(f, name, description, idempotent, concurrency_safe, timeout, inline)

    return wrap(fn) if fn is not None else wrap


def tools_by_name(tools: Mapping[str, Tool] | list[Tool] | tuple[Tool, ...]) -> dict[str, Tool]:
    """Tools keyed by name; a duplicate name, or a tool whose parameters' schema cannot
    check arguments (``schema_problem``), raises ``ConfigError``."""
    found: dict[str, Tool] = {}
    for t in tools.values() if isinstance(tools, Mapping) else tools:
        if not isinstance(t, Tool):
            raise ConfigError(f"not a tool: {t!r} (decorate it with @statekernel.tool)")
        if t.name in found:
            raise ConfigError(f"two tools are named {t.name!r}")
        problem = schema_problem(t.parameters)
        if problem is not None:
            raise ConfigError(f"tool {t.name!r}: the schema of its parameters is {problem}")
        found[t.name] = t
    return found


def tool_names(where: str, names: Any) -> set[str]:
    """``names`` (``idempotent=`` of the MCP and adapter helpers) as a set of tool names.

    Raises:
        ConfigError: not an iterable of ``str``, or a ``str`` itself (which would be read
            as its characters).
    """
    if isinstance(names, str | bytes) or not isinstance(names, typing.Iterable):
        raise ConfigError(f"{where}: idempotent= takes tool names (a list of str), got {names!r}")
    found = list(names)
    for name in found:
        if type(name) is not str:
            raise ConfigError(f"{where}: idempotent= holds {name!r}, which is not a tool name")
    return set(found)
