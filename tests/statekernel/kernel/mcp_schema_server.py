"""An MCP server for the tests whose one tool, ``lookup``, declares the input schema
given as JSON in ``MCP_TEST_SCHEMA`` (whatever the SDK would derive); a call appends
its arguments to the file named by ``MCP_TEST_LOG``. Run as a script it serves stdio."""

from __future__ import annotations

import json
import os
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import Tool


class DeclaredSchemaServer(MCPServer):
    """Lists its tools with the input schema of ``MCP_TEST_SCHEMA``."""

    async def list_tools(self) -> list[Tool]:
        schema = json.loads(os.environ["MCP_TEST_SCHEMA"])
        return [t.model_copy(update={"input_schema": schema}) for t in await super().list_tools()]


server = DeclaredSchemaServer("statekernel-test-schema")


@server.tool(structured_output=False)
def lookup(q: Any = None) -> str:
    """Look something up."""
    with open(os.environ["MCP_TEST_LOG"], "a") as log:
        log.write(json.dumps(q) + "\n")
    return "found"


if __name__ == "__main__":
    server.run()
