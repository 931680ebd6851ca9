"""Tools written for other libraries, used as statekernel tools: a LangChain tool, a
pydantic-ai ``Tool``, the tools of an in-process MCP server (``MCPServer``, FastMCP).

Each library is optional and imported only when its adapter is called. The flags
(``idempotent``, ``concurrency_safe``, ``timeout``) are statekernel's and are given
here: a tool of another library is not idempotent unless the caller says so.
"""

from __future__ import annotations

from typing import Any

from statekernel._kernel.schema import schema_problem
from statekernel._kernel.tools import SchemaTool, Tool, tool, tool_names
from statekernel._records.messages import JSON
from statekernel.errors import ConfigError, ToolError

__all__ = ["tool_from_langchain", "tool_from_pydantic_ai", "tools_from_mcp_server"]


def tool_from_langchain(
    lc_tool: Any,
    *,
    idempotent: bool = False,
    concurrency_safe: bool = True,
    timeout: float | None = None,
) -> Tool:
    """A LangChain tool (``langchain_core.tools.BaseTool``: ``@langchain_core.tools.tool``,
    ``StructuredTool``, a ``BaseTool`` subclass) as a statekernel ``Tool``.

    The model sees the tool's name, description and the JSON schema LangChain gives the
    model (``convert_to_openai_tool``); arguments are checked against that schema, then
    the tool runs with them (``ainvoke``, which validates them again with its own
    ``args_schema``) and its result is the output. ``ConfigError`` if ``lc_tool`` is no
    LangChain tool or ``langchain-core`` is not installed.

    Returns:
        The statekernel tool, named as the LangChain tool is.

    Raises:
        ConfigError: ``langchain-core`` is not installed, ``lc_tool`` is not a LangChain
            tool, or the schema of its parameters cannot check arguments.
    """
    try:
        from langchain_core.tools import BaseTool
        from langchain_core.utils.function_calling import convert_to_openai_tool
    except ImportError as exc:
        raise ConfigError(f"tool_from_langchain needs langchain-core installed ({exc})") from exc
    if not isinstance(lc_tool, BaseTool):
        raise ConfigError(f"not a LangChain tool (langchain_core.tools.BaseTool): {lc_tool!r}")
    function = convert_to_openai_tool(lc_tool)["function"]
    schema = dict(function.get("parameters") or {"type": "object", "properties": {}})

    async def call(**arguments: Any) -> Any:
        return await lc_tool.ainvoke(arguments)

    return _schema_tool(
        lc_tool.name,
        str(function.get("description") or ""),
        schema,
        call,
        idempotent=idempotent,
        concurrency_safe=concurrency_safe,
        timeout=timeout,
    )


def tool_from_pydantic_ai(
    pa_tool: Any,
    *,
    idempotent: bool = False,
    concurrency_safe: bool = True,
    timeout: float | None = None,
) -> Tool:
    """A pydantic-ai ``Tool`` (``pydantic_ai.Tool(function, ...)``) as a statekernel
    ``Tool``: its function, name and description, built as ``@statekernel.tool`` builds
    one (pydantic types, docstring descriptions). A tool that takes a pydantic-ai
    ``RunContext`` is a ``ConfigError``: only a pydantic-ai agent run can give one (take
    a ``ctx: statekernel.ToolContext`` instead).

    Returns:
        The statekernel tool, named and described as the pydantic-ai tool is.

    Raises:
        ConfigError: pydantic-ai is not installed, ``pa_tool`` is not a pydantic-ai
            ``Tool``, it takes a ``RunContext``, or its function cannot be made a tool
            (as for ``statekernel.tool``).
    """
    try:
        from pydantic_ai import Tool as PydanticAITool
    except ImportError as exc:
        raise ConfigError(f"tool_from_pydantic_ai needs pydantic-ai installed ({exc})") from exc
    if not isinstance(pa_tool, PydanticAITool):
        raise ConfigError(f"not a pydantic-ai Tool: {pa_tool!r}")
    if pa_tool.takes_ctx:
        raise ConfigError(
            f"pydantic-ai tool {pa_tool.name!r} takes a RunContext, which only a pydantic-ai "
            "agent run gives; take a `ctx: statekernel.ToolContext` parameter instead"
        )
    return tool(
        name=pa_tool.name,
        description=pa_tool.description or None,
        idempotent=idempotent,
        concurrency_safe=concurrency_safe,
        timeout=timeout,
    )(pa_tool.function)


async def tools_from_mcp_server(
    server: Any,
    *,
    idempotent: tuple[str, ...] | list[str] = (),
    call_timeout: float | None = None,
) -> list[Tool]:
    """The tools of an MCP server object in this process (the SDK's ``MCPServer``, which
    was ``FastMCP`` before mcp 2), called directly without a transport.

    Each tool's schema is the server's; arguments are checked against it and the server
    calls the function (its own validation, its ``Context``). A tool is idempotent if the
    server marks it ``readOnlyHint`` or ``idempotentHint``, or it is named in
    ``idempotent``. An error the server raises or reports is an error result;
    ``call_timeout`` (seconds) is each call's ``timeout``.

    Returns:
        The server's tools, in the order the server lists them.

    Raises:
        ConfigError: ``server`` has no ``list_tools``/``call_tool``, a tool's input
            schema cannot check arguments, ``idempotent`` is not a list of tool names,
            or ``call_timeout`` is not a number of seconds above 0.
    """
    from statekernel._kernel.mcp import MCPTool, _output

    list_tools = getattr(server, "list_tools", None)
    if not callable(list_tools) or not callable(getattr(server, "call_tool", None)):
        raise ConfigError(f"not an MCP server (no list_tools/call_tool): {server!r}")
    trusted = tool_names("tools_from_mcp_server", idempotent)
    found: list[Tool] = []
    for spec in await list_tools():
        name: str = spec.name
        hints = spec.annotations
        marked = bool(hints and (hints.read_only_hint or hints.idempotent_hint))
        schema = dict(spec.input_schema or {"type": "object"})
        problem = schema_problem(schema)
        if problem is not None:
            raise ConfigError(f"MCP server tool {name!r}: its input schema is {problem}")

        found.append(
            MCPTool(
                name=name,
                description=spec.description or "",
                parameters=schema,
                fn=_server_call(server, name, _output),
                arguments_type=dict,
                idempotent=marked or name in trusted,
                timeout=call_timeout,
            )
        )
    return found


def _server_call(server: Any, name: str, output: Any) -> Any:
    async def call(**arguments: Any) -> JSON:
        result = await server.call_tool(name, arguments)
        if not hasattr(result, "content"):
            raise ToolError(f"{name}: the server asked for input, which a tool cannot give")
        json: JSON = output(name, result)
        return json

    return call


def _schema_tool(
    name: str,
    description: str,
    schema: dict[str, Any],
    fn: Any,
    *,
    idempotent: bool,
    concurrency_safe: bool,
    timeout: float | None,
) -> Tool:
    problem = schema_problem(schema)
    if problem is not None:
        raise ConfigError(f"tool {name!r}: the schema of its parameters is {problem}")
    return SchemaTool(
        name=name,
        description=description,
        parameters=schema,
        fn=fn,
        arguments_type=dict,
        idempotent=idempotent,
        concurrency_safe=concurrency_safe,
        timeout=timeout,
    )
