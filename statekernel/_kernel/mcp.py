"""Tools from MCP servers, over stdio or streamable HTTP, through the official ``mcp`` SDK.

A connection is process-local, like a provider: each process that drives runs opens
its own (``async with mcp_stdio(...) as server``) and builds its tools from it;
nothing of it is stored. The tool list and each tool's JSON Schema come from the
server; arguments are checked against the schema before the call (``jsonschema``), and
a call the server reports as failed is an error result. A schema that cannot check
arguments (invalid, or a ``$ref`` that resolves nowhere) is refused when the tools are
listed. A tool is idempotent (re-run
when a crash interrupted it) only if the server marks it ``readOnlyHint`` or
``idempotentHint``, or the caller names it; any other interrupted call pauses the run
with ``uncertain_tool_calls``, as for every tool.

The SDK's transports must be entered and left in one task, so a connection runs in a
task of its own, and calls from any task go through its session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from statekernel._kernel.schema import schema_problem
from statekernel._kernel.tools import SchemaTool, Tool, tool_names
from statekernel._records.messages import JSON
from statekernel._secrets import (
    redact,
    redact_url,
    remember_secret_values,
    remember_url,
)
from statekernel._storage.closing import Closing
from statekernel.errors import ConfigError, ToolError

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult

__all__ = ["MCPConnection", "MCPTool", "mcp_http", "mcp_stdio"]

Opener = Callable[[contextlib.AsyncExitStack], Awaitable["ClientSession"]]


class MCPConnection(Closing):
    """A live session with one MCP server; ``tools()`` lists its tools as ``Tool`` objects.

    Use it as an async context manager (or ``start``/``aclose``). The session is opened
    by a task of the connection's own and closed by it.
    """

    def __init__(self, name: str, opener: Opener, *, connect_timeout: float = 30.0) -> None:
        self.name = name
        self.connect_timeout = connect_timeout
        self._opener = opener
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __aenter__(self) -> MCPConnection:
        await self.start()
        return self

    async def start(self) -> None:
        """Connect and initialize; a server that cannot be reached raises ``ConfigError``.

        Does nothing when the connection is started already.

        Raises:
            ConfigError: the server could not be started or reached, failed to
                initialize, closed before it was ready, or did not answer within
                ``connect_timeout`` seconds.
        """
        if self._task is not None:
            return
        self._stop = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._own(ready))
        task = self._task
        await asyncio.wait(
            [task, ready], timeout=self.connect_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if ready.done():
            return
        if task.done():
            self._task = None
            task.result()  # what stopped it before it was ready
            raise ConfigError(f"MCP server {self.name!r} closed before it was ready")
        await self.aclose()
        raise ConfigError(
            f"MCP server {self.name!r} did not answer within {self.connect_timeout} s"
        )

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                session = await self._opener(stack)
                await session.initialize()
                self._session = session
                ready.set_result(None)
                await self._stop.wait()
        except Exception as exc:
            if ready.done():
                raise
            detail = redact(f"{type(exc).__name__}: {exc}")
            raise ConfigError(f"MCP server {self.name!r}: {detail}") from exc
        finally:
            self._session = None

    async def aclose(self) -> None:
        """Close the session (a stdio server process ends with it)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        if self._session is None:
            task.cancel()  # still connecting
        await asyncio.wait([task])  # a cancellation of the caller still reaches it
        if not task.cancelled():
            task.exception()  # what closing raised is not the caller's concern

    @property
    def session(self) -> ClientSession:
        """The open session; ``ToolError`` once the connection is closed."""
        if self._session is None:
            raise ToolError(f"MCP server {self.name!r} is not connected")
        return self._session

    async def tools(
        self, *, idempotent: Iterable[str] = (), call_timeout: float | None = None
    ) -> list[Tool]:
        """The server's tools, each calling it through this connection.

        ``idempotent`` names tools to treat as idempotent though the server does not
        mark them so; ``call_timeout`` (seconds) applies to each call. A tool whose
        input schema cannot check arguments (see ``schema_problem``: invalid, or a
        ``$ref`` that resolves nowhere) raises ``ConfigError`` naming it.

        Returns:
            The server's tools, in the order it lists them (every page of the listing).

        Raises:
            ConfigError: a tool's input schema cannot check arguments, ``idempotent``
                is not a list of tool names, or ``call_timeout`` is not a number of
                seconds above 0.
            ToolError: the connection is not open.
        """
        from mcp.types import PaginatedRequestParams

        trusted = tool_names(f"MCP server {self.name!r}", idempotent)
        found: list[Tool] = []
        page = await self.session.list_tools()
        while True:
            for spec in page.tools:
                hints = spec.annotations
                marked = bool(hints and (hints.read_only_hint or hints.idempotent_hint))
                found.append(self._tool(spec, marked or spec.name in trusted, call_timeout))
            if not page.next_cursor:
                return found
            params = PaginatedRequestParams(cursor=page.next_cursor)
            page = await self.session.list_tools(params=params)

    def _tool(self, spec: Any, idempotent: bool, timeout: float | None) -> MCPTool:
        name: str = spec.name
        schema = dict(spec.input_schema or {"type": "object"})
        problem = schema_problem(schema)
        if problem is not None:
            raise ConfigError(
                f"MCP server {self.name!r}, tool {name!r}: its input schema is {problem}"
            )

        async def call(**arguments: Any) -> JSON:
            return await self._call(name, arguments, idempotent)

        return MCPTool(
            name=name,
            description=spec.description or "",
            parameters=schema,
            fn=call,
            arguments_type=dict,
            idempotent=idempotent,
            timeout=timeout,
        )

    async def _call(self, name: str, arguments: dict[str, Any], idempotent: bool) -> JSON:
        from mcp import MCPError

        try:
            result = await self.session.call_tool(name, arguments)
        except MCPError as exc:
            lead = "" if idempotent else "outcome unknown: "
            detail = redact(str(exc))
            raise ToolError(f"{lead}MCP server {self.name!r}, tool {name}: {detail}") from exc
        return _output(name, result)


@attrs.frozen
class MCPTool(SchemaTool):
    """A tool of an MCP server: arguments are checked against the server's JSON Schema."""


def _output(name: str, result: CallToolResult) -> JSON:
    """What the model sees: the text of the result (one part: a string), other parts as
    their JSON, structured content when there is nothing else; an error result raises."""
    from mcp.types import TextContent

    parts: list[JSON] = [
        p.text if isinstance(p, TextContent) else p.model_dump(mode="json", by_alias=True)
        for p in result.content
    ]
    if result.is_error:
        text = " ".join(p for p in parts if isinstance(p, str)) or "the tool failed"
        raise ToolError(f"{name}: {text}")
    if not parts:
        return result.structured_content
    return parts[0] if len(parts) == 1 else parts


def mcp_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    name: str | None = None,
    errlog: Any = None,
) -> MCPConnection:
    """A connection to an MCP server run as a subprocess speaking over stdio.

    The process gets the SDK's minimal environment plus ``env``; its stderr goes to
    ``errlog`` (default: this process's stderr). Values of ``env`` whose names look
    secret (``*_KEY``, ``*_TOKEN``, ``*PASSWORD*``, ...) are hidden wherever
    statekernel shows, logs or stores text (``redact``).

    Returns:
        The connection, not yet started: the process starts on ``start`` (or on
            entering it as a context manager).

    Raises:
        ImportError: the MCP SDK (the ``mcp`` extra) is not installed.
    """
    remember_secret_values(dict(env or {}))
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=command, args=list(args), env=dict(env or {}), cwd=cwd)

    async def opener(stack: contextlib.AsyncExitStack) -> ClientSession:
        client = stdio_client(params) if errlog is None else stdio_client(params, errlog)
        read, write = await stack.enter_async_context(client)
        return await stack.enter_async_context(ClientSession(read, write))

    return MCPConnection(name or command, opener)


def mcp_http(
    url: str, *, headers: Mapping[str, str] | None = None, name: str | None = None
) -> MCPConnection:
    """A connection to an MCP server over streamable HTTP at ``url`` (e.g. ``.../mcp``);
    ``headers`` go with every request (``{"Authorization": "Bearer ..."}``).

    The connection is named after ``url`` with its credentials hidden (userinfo, secret
    query parameters); those and the values of credential headers are hidden wherever
    statekernel shows, logs or stores text, tool errors the model reads included.

    Returns:
        The connection, not yet started: it connects on ``start`` (or on entering it
            as a context manager).

    Raises:
        ImportError: the MCP SDK or ``httpx2`` (the ``mcp`` extra) is not installed.
    """
    remember_url(url)
    remember_secret_values(dict(headers or {}))
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def opener(stack: contextlib.AsyncExitStack) -> ClientSession:
        timeout = httpx2.Timeout(30.0, read=300.0)  # a server may hold a stream open
        client = httpx2.AsyncClient(headers=dict(headers or {}), timeout=timeout)
        http = await stack.enter_async_context(client)
        transport = streamable_http_client(url, http_client=http)
        read, write = await stack.enter_async_context(transport)
        return await stack.enter_async_context(ClientSession(read, write))

    return MCPConnection(name or redact_url(url), opener)
