"""An MCP server for the tests, written with the SDK's server side: ``echo`` (marked
read-only and idempotent), ``append_line`` (a side effect: a line appended to the file
named by ``MCP_TEST_LOG``) and ``fail`` (raises). Run as a script it serves stdio."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("statekernel-test")


@server.tool(
    description="Echo the text back.",
    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    structured_output=False,
)
def echo(text: str, times: int = 1) -> str:
    return " ".join([text] * times)


@server.tool(structured_output=False)
def append_line(line: str) -> str:
    """Append a line to the log file."""
    with open(os.environ["MCP_TEST_LOG"], "a") as log:
        log.write(line + "\n")
    return f"appended {line}"


@server.tool(structured_output=False)
def fail(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"refused: {reason}")


if __name__ == "__main__":
    server.run()
