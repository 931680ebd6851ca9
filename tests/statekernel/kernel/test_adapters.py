"""Tools of other libraries as statekernel tools: LangChain, pydantic-ai, an in-process
MCP server (``MCPServer``, FastMCP before mcp 2), each the real library."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import pytest
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.tools import tool as langchain_tool
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
from pydantic import BaseModel, Field
from pydantic_ai import RunContext
from pydantic_ai import Tool as PydanticAITool

import statekernel as sk
from statekernel.errors import ConfigError, ToolError
from statekernel.testing import call

from ..conftest import MakeKernel, drain, start

CTX = sk.ToolContext("r", "c", 1, {})


@langchain_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Query(BaseModel):
    text: str = Field(description="What to look for.")
    limit: int = 3


class Search(BaseTool):
    """A BaseTool subclass with an args_schema of its own."""

    name: str = "search"
    description: str = "Search the catalogue."
    args_schema: type[BaseModel] = Query

    def _run(self, text: str, limit: int = 3) -> list[str]:
        return [f"{text} {i}" for i in range(limit)]


async def test_a_langchain_tool_runs_as_a_statekernel_tool(make_kernel: MakeKernel) -> None:
    tool = sk.tool_from_langchain(add, idempotent=True)
    assert tool.spec.name == "add"
    assert tool.spec.description == "Add two numbers."
    assert tool.spec.parameters["properties"] == {
        "a": {"type": "integer"},
        "b": {"type": "integer"},
    }
    assert tool.idempotent
    kernel, _, _ = make_kernel([call("add", {"a": 2, "b": 3}), "five"], tools=[tool])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.turns[0].completed[0].output == 5


async def test_a_langchain_base_tool_subclass_and_bad_arguments() -> None:
    tool = sk.tool_from_langchain(Search())
    props = tool.spec.parameters["properties"]
    assert props["text"]["description"] == "What to look for."
    assert await tool.invoke({"text": "tea", "limit": 2}, CTX) == ["tea 0", "tea 1"]
    with pytest.raises(ToolError, match=r"invalid arguments for search\['limit'\]"):
        tool.validate({"text": "tea", "limit": "2"})
    with pytest.raises(ToolError, match="'text' is a required property"):
        tool.validate({})


def test_a_structured_tool_and_what_is_no_langchain_tool() -> None:
    def shout(word: str) -> str:
        return word.upper()

    structured = StructuredTool.from_function(shout, description="Shout a word.")
    assert sk.tool_from_langchain(structured).spec.description == "Shout a word."
    with pytest.raises(ConfigError, match="not a LangChain tool"):
        sk.tool_from_langchain(shout)


class Booking(BaseModel):
    guests: int
    at: datetime.datetime


def book(booking: Booking, note: str = "") -> str:
    """Book a table.

    Args:
        booking: Who and when.
        note: For the restaurant.
    """
    return f"{booking.guests} at {booking.at:%H:%M} {note}".strip()


async def test_a_pydantic_ai_tool_keeps_its_types_and_descriptions() -> None:
    tool = sk.tool_from_pydantic_ai(PydanticAITool(book, name="reserve"), timeout=5)
    assert tool.name == "reserve"
    assert tool.spec.description == "Book a table."
    props = tool.spec.parameters["properties"]
    assert props["booking"]["description"] == "Who and when."
    assert tool.timeout == 5
    arguments = {"booking": {"guests": 2, "at": "2026-01-02T20:00:00"}}
    assert await tool.invoke(arguments, CTX) == "2 at 20:00"
    with pytest.raises(ToolError, match=r"@ \$\.booking\.guests"):
        tool.validate({"booking": {"guests": "two", "at": "2026-01-02T20:00:00"}})


def test_a_pydantic_ai_tool_that_takes_a_run_context_is_refused() -> None:
    def needs_context(ctx: RunContext[None], city: str) -> str:
        """Needs pydantic-ai's context."""
        return city

    with pytest.raises(ConfigError, match="takes a RunContext"):
        sk.tool_from_pydantic_ai(PydanticAITool(needs_context, takes_ctx=True))
    with pytest.raises(ConfigError, match="not a pydantic-ai Tool"):
        sk.tool_from_pydantic_ai(book)


server = MCPServer("shop")


@server.tool()
def price(item: Annotated[str, Field(description="The item's name.")], count: int = 1) -> float:
    """The price of some items."""
    if item == "unicorn":
        raise MCPToolError("no such item")
    return 1.5 * count


async def test_the_tools_of_an_mcp_server_object_run_in_process(make_kernel: MakeKernel) -> None:
    tools = await sk.tools_from_mcp_server(server, idempotent=["price"])
    assert [t.name for t in tools] == ["price"]
    (tool,) = tools
    assert tool.idempotent
    assert tool.spec.description == "The price of some items."
    assert tool.spec.parameters["properties"]["item"]["description"] == "The item's name."
    with pytest.raises(ToolError, match=r"price\['count'\]"):
        tool.validate({"item": "tea", "count": "2"})
    with pytest.raises(MCPToolError, match="price: no such item"):  # an error result
        await tool.invoke({"item": "unicorn"}, CTX)
    kernel, _, _ = make_kernel([call("price", {"item": "tea", "count": 2}), "3"], tools=tools)
    run = await start(kernel)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.turns[0].completed[0].output == "3.0"


async def test_the_options_of_an_mcp_server_object_are_checked() -> None:
    # a str would be read as its characters: "price" made tools "p", "r"... idempotent
    with pytest.raises(ConfigError, match=r"idempotent= takes tool names .* got 'price'"):
        await sk.tools_from_mcp_server(server, idempotent="price")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"idempotent= holds 5, which is not a tool name"):
        await sk.tools_from_mcp_server(server, idempotent=[5])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"tool 'price': timeout must be a finite number"):
        await sk.tools_from_mcp_server(server, call_timeout=-1)


async def test_a_function_of_an_mcp_server_is_a_tool_as_it_is() -> None:
    tool = sk.tool(price)  # the decorator gives the function back
    props = tool.spec.parameters["properties"]
    assert props["item"] == {"type": "string", "description": "The item's name."}
    assert await tool.invoke({"item": "tea", "count": 2}, CTX) == 3.0


async def test_what_is_no_mcp_server_is_refused() -> None:
    not_a_server: Any = object()
    with pytest.raises(ConfigError, match="not an MCP server"):
        await sk.tools_from_mcp_server(not_a_server)
