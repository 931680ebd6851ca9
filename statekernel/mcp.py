"""Tools from MCP servers: open a connection with :func:`mcp_stdio` or :func:`mcp_http`
and hand ``await connection.tools()`` to a kernel."""

from __future__ import annotations

from statekernel._kernel.mcp import MCPConnection, mcp_http, mcp_stdio

__all__ = ["MCPConnection", "mcp_http", "mcp_stdio"]
