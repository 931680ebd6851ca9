"""MCP tools: a run calls the tools of an MCP server it started as a subprocess.

The file is both: ``python examples/mcp_tools.py server`` serves two tools over stdio
(written with the ``mcp`` SDK's server side: ``convert``, marked read-only, and
``note``, which has a side effect); ``python examples/mcp_tools.py`` connects to that
server with ``statekernel.mcp.mcp_stdio``, hands its tools to a kernel and runs an agent that calls
both. Needs ``pip install -e '.[mcp]'``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

NOTES = "NOTES_FILE"


def serve() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("units")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
    def convert(celsius: float) -> str:
        """Convert a temperature from Celsius to Fahrenheit."""
        return f"{celsius * 9 / 5 + 32:.1f} F"

    @server.tool(structured_output=False)
    def note(text: str) -> str:
        """Write a note down."""
        with open(os.environ[NOTES], "a") as notes:
            notes.write(text + "\n")
        return "noted"

    server.run()


async def main() -> None:
    import statekernel as sk
    from statekernel.mcp import mcp_stdio
    from statekernel.testing import ScriptedProvider, call

    notes = Path(tempfile.mkdtemp()) / "notes.txt"
    model = ScriptedProvider(
        [
            [call("convert", {"celsius": 21}), call("note", {"text": "Paris: 21 C"})],
            "It is 69.8 F in Paris; noted.",
        ]
    )
    server = mcp_stdio(
        sys.executable, [__file__, "server"], env={NOTES: str(notes)}, errlog=sys.stderr
    )
    async with server:
        tools = await server.tools()
        for tool in tools:
            print(f"tool {tool.name}: idempotent={tool.idempotent}")
        async with sk.Kernel("memory://", tools=tools, providers={"scripted": model}) as kernel:
            run = await kernel.start(model="scripted/units", messages=["Paris is at 21 C."])
            async for _ in kernel.run(run.run_id):
                pass
            done = await kernel.get(run.run_id)
            for record in sorted(done.turns[0].completed, key=lambda r: r.name):
                print(f"{record.name}: {record.output}")
            print(done.output)
    print(f"notes: {notes.read_text().strip()}")


if __name__ == "__main__":
    if sys.argv[1:] == ["server"]:
        serve()
    else:
        asyncio.run(main())
