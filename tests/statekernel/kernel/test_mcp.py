"""MCP tools against real MCP servers (the SDK's server side): a stdio subprocess and a
streamable HTTP server on loopback. Tool lists and schemas come from the server,
arguments are checked before the call, failures are error results, idempotence comes
from the server's annotations or the caller, and a crash during a call resumes without
running a side effect twice."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statekernel as sk
from statekernel.errors import ConfigError
from statekernel.mcp import MCPConnection, mcp_http, mcp_stdio
from statekernel.stores import MemoryStore
from statekernel.testing import (
    Crash,
    CrashAt,
    FaultPlan,
    ScriptedProvider,
    call,
    check_crash_resume,
)
from statekernel.testing import strategies as sts

SERVER = Path(__file__).with_name("mcp_server.py")


@pytest.fixture(params=["stdio", "http"])
def connect(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> object:
    """A function opening a new connection to the test server (one per 'process')."""
    log = tmp_path / "effects.log"
    log.touch()
    monkeypatch.setenv("MCP_TEST_LOG", str(log))  # the HTTP server runs in this process
    url = request.getfixturevalue("mcp_http_url") if request.param == "http" else ""

    def open_connection() -> MCPConnection:
        if request.param == "http":
            return mcp_http(url, name="test-http")
        devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the server process
        return mcp_stdio(
            sys.executable, [str(SERVER)], env={"MCP_TEST_LOG": str(log)}, errlog=devnull
        )

    return open_connection


@pytest.fixture
async def server(connect: object) -> AsyncIterator[MCPConnection]:
    async with connect() as connection:  # type: ignore[operator]
        yield connection


def _log(tmp_path: Path) -> list[str]:
    return (tmp_path / "effects.log").read_text().splitlines()


async def test_tools_and_schemas_come_from_the_server(server: MCPConnection) -> None:
    tools = {t.name: t for t in await server.tools()}
    assert set(tools) == {"echo", "append_line", "fail"}
    echo = tools["echo"]
    assert echo.description == "Echo the text back."
    assert echo.parameters["properties"]["text"]["type"] == "string"
    assert echo.parameters["required"] == ["text"]
    assert echo.idempotent  # the server marks it read-only and idempotent
    assert not tools["append_line"].idempotent
    trusted = {t.name: t for t in await server.tools(idempotent=["append_line"])}
    assert trusted["append_line"].idempotent
    with pytest.raises(ConfigError, match=r"idempotent= takes tool names .* 'append_line'"):
        await server.tools(idempotent="append_line")


async def test_a_run_calls_mcp_tools_and_failures_are_error_results(
    server: MCPConnection, tmp_path: Path
) -> None:
    turn = [
        call("echo", {"text": "hi", "times": 2}, id="e"),
        call("append_line", {"line": "one"}, id="a"),
        call("append_line", {"line": 5}, id="bad"),  # not a string: never sent
        call("fail", {"reason": "no"}, id="f"),
    ]
    provider = ScriptedProvider([turn, "done"])
    kernel = sk.Kernel(MemoryStore(), tools=await server.tools(), providers={"scripted": provider})
    run = await kernel.start(model="scripted/x", messages=["go"])
    async for _ in kernel.run(run.run_id):
        pass
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    records = {r.id: r for r in final.turns[0].completed}
    assert records["e"].output == "hi hi"
    assert records["a"].output == "appended one"
    assert "invalid arguments for append_line['line']: 5 is not of type 'string'" in (
        records["bad"].error or ""
    )
    assert records["f"].error == "fail: Error executing tool fail: refused: no"
    assert _log(tmp_path) == ["one"]
    await kernel.aclose()


@pytest.mark.parametrize("tool", ["append_line", "echo"])
async def test_a_crash_during_an_mcp_call_resumes_without_a_second_effect(
    connect: object, tmp_path: Path, tool: str
) -> None:
    store = MemoryStore()
    arguments = {"line": "paid"} if tool == "append_line" else {"text": "again"}
    script = [call(tool, arguments, id="c1"), "done"]
    plan = FaultPlan([CrashAt("tool_after_effect", 1)])
    async with connect() as first:  # type: ignore[operator]
        kernel = sk.Kernel(
            store,
            tools=await first.tools(),
            providers={"scripted": ScriptedProvider(script)},
            middleware=[plan.middleware()],
        )
        run = await kernel.start(model="scripted/x", messages=["go"])
        with pytest.raises(Crash):
            async for _ in kernel.run(run.run_id):
                pass
    async with connect() as second:  # type: ignore[operator]  # a new process, a new session
        kernel = sk.Kernel(
            store, tools=await second.tools(), providers={"scripted": ScriptedProvider(script)}
        )
        async for _ in kernel.run(run.run_id):
            pass
        after = await kernel.get(run.run_id)
        if tool == "append_line":  # not idempotent: the run asks what happened
            assert after.pause is not None
            assert after.pause.reason == "uncertain_tool_calls"
            assert _log(tmp_path) == ["paid"]
            await kernel.resolve_tool_call(run.run_id, "c1", output="appended paid")
            async for _ in kernel.run(run.run_id):
                pass
        final = await kernel.get(run.run_id)
        assert final.state == "completed"
        record = final.turns[0].completed[0]
        expected = "appended paid" if tool == "append_line" else "again"
        assert (record.output, record.resolved) == (expected, tool == "append_line")
        assert _log(tmp_path) == (["paid"] if tool == "append_line" else [])
        await kernel.aclose()


async def test_a_server_that_cannot_start_is_a_config_error() -> None:
    with pytest.raises(sk.errors.ConfigError, match="MCP server"):
        async with mcp_stdio(sys.executable, ["-c", "import sys; sys.exit(3)"]):
            pass


async def test_http_headers_reach_the_server_and_a_refusal_is_a_config_error() -> None:
    import asyncio

    seen: list[bytes] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = mcp_http(
        f"http://127.0.0.1:{port}/mcp", headers={"Authorization": "Bearer t0ken"}, name="guarded"
    )
    connection.connect_timeout = 10
    try:
        with pytest.raises(sk.errors.ConfigError, match="MCP server 'guarded'"):
            await connection.start()
    finally:
        await connection.aclose()
        server.close()
        await server.wait_closed()
    assert seen
    assert b"authorization: bearer t0ken" in seen[0].lower()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=sts.crash_schedules(max_commit=14, max_other=4), eager=st.booleans())
def test_crash_resume_invariants_hold_for_mcp_tools(
    mcp_http_url: str, tmp_path: Path, schedule: list[CrashAt], eager: bool
) -> None:
    """The crash/resume fuzzing over MCP tools (the loopback HTTP server): a crash at any
    point, the run resumed in a fresh kernel, never runs ``append_line`` twice."""
    os.environ["MCP_TEST_LOG"] = str(tmp_path / "fuzz.log")
    script = [
        [call("append_line", {"line": "a"}), call("echo", {"text": "b"})],
        [call("append_line", {"line": "c"})],
        "done",
    ]

    async def case() -> None:
        async with mcp_http(mcp_http_url, name="fuzz") as connection:
            tools = await connection.tools()

            def agent() -> dict[str, object]:
                return {
                    "tools": tools,
                    "providers": {"scripted": ScriptedProvider(script)},
                    "dispatch": sk.DispatchPolicy(eager=eager),
                }

            store = MemoryStore()
            report = await check_crash_resume(
                agent,
                start={"model": "scripted/x", "messages": ["go"]},
                schedule=schedule,
                store=lambda: store,
            )
            assert report.final.state == "completed"

    asyncio.run(case())


SCHEMA_SERVER = Path(__file__).with_name("mcp_schema_server.py")


def _declaring(schema: object, log: Path) -> MCPConnection:
    """A connection to a server whose tool ``lookup`` declares ``schema``."""
    log.touch()
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the server process
    env = {"MCP_TEST_SCHEMA": json.dumps(schema), "MCP_TEST_LOG": str(log)}
    return mcp_stdio(sys.executable, [str(SCHEMA_SERVER)], env=env, errlog=devnull)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {"type": "object", "properties": {"q": {"$ref": "#/$defs/missing"}}},
            "'#/$defs/missing' resolves nowhere",
        ),
        (
            {"type": "object", "$ref": "#/definitions/missing"},
            "'#/definitions/missing' resolves nowhere",
        ),
        ({"type": "object", "properties": {"q": {"$ref": "#/properties/q"}}}, "refers back"),
        ({"type": "object", "properties": {"q": {"pattern": "("}}}, "is not a 'regex'"),
        ({"type": "object", "properties": {"q": {"type": "text"}}}, "not a valid JSON Schema"),
    ],
)
async def test_a_tool_with_an_unusable_schema_is_refused_when_listed(
    tmp_path: Path, schema: object, problem: str
) -> None:
    async with _declaring(schema, tmp_path / "effects.log") as server:
        with pytest.raises(sk.errors.ConfigError) as refused:
            await server.tools()
    message = str(refused.value)
    assert "'lookup'" in message
    assert problem in message


async def test_a_schema_that_fails_only_on_some_arguments_is_an_error_result(
    tmp_path: Path,
) -> None:
    # the cycle goes through allOf, so it is only met when an argument reaches it
    looping = {"type": "object", "properties": {"q": {"allOf": [{"$ref": "#/properties/q"}]}}}
    log = tmp_path / "effects.log"
    async with _declaring(looping, log) as server:
        turn = [call("lookup", {"q": 1}, id="q1")]
        provider = ScriptedProvider([turn, "done"])
        kernel = sk.Kernel(
            MemoryStore(), tools=await server.tools(), providers={"scripted": provider}
        )
        run = await kernel.start(model="scripted/x", messages=["go"])
        async for _ in kernel.run(run.run_id):
            pass
        final = await kernel.get(run.run_id)
        await kernel.aclose()
    assert final.state == "completed"
    record = final.turns[0].completed[0]
    assert record.output is None
    assert (record.error or "").startswith("invalid arguments for lookup: the schema cannot")
    (result,) = [p for m in final.messages for p in m.content if isinstance(p, sk.ToolResult)]
    assert (result.content, result.is_error) == (record.error, True)  # the model reads why
    assert log.read_text() == ""  # never sent to the server


async def test_a_kernel_refuses_an_mcp_tool_with_an_unusable_schema() -> None:
    from statekernel._kernel.mcp import MCPTool

    async def never(**_: object) -> str:
        raise AssertionError("not called")

    broken = MCPTool(
        name="lookup",
        description="",
        parameters={"$ref": "#/definitions/missing"},
        fn=never,
        arguments_type=dict,
    )
    with pytest.raises(sk.errors.ConfigError, match=r"'lookup'.*resolves nowhere"):
        sk.Kernel(MemoryStore(), tools=[broken], providers={"scripted": ScriptedProvider([])})
