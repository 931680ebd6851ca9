"""The LangGraph side of ``bench/anchor.py``; runs in the LangGraph venv, never imports statekernel.

``StateGraph(MessagesState)`` with an ``agent`` node (the scripted model) and a ``tools``
node, on the workload of ``anchor_workload``. ``serve`` reads one JSON command per line
on stdin and answers one JSON line on stdout, so that ``anchor.py`` can interleave its
measurements with statekernel's without paying LangGraph's import for each one:

    {"op": "run", "variant": "sqlite" | "none", "n": 100, "db": "/tmp/x.db"}
        -> {"seconds": ..., "cpu": ..., "bytes": ... | null}
    {"op": "resume", "db": "/tmp/x.db"} -> {"seconds": ...}
    {"op": "empty", "db": "/tmp/y.db"} -> {"bytes": ...}  (a database with the schema only)

``once N DB`` runs the SqliteSaver variant once (for ``strace``).
"""

from __future__ import annotations

import gc
import json
import sqlite3
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from anchor_workload import (
    FINAL_TEXT,
    RESUME_TEXT,
    TOOL_NAME,
    USER_TEXT,
    call_id,
    tool_arguments,
    tool_output,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

THREAD = "bench-thread"


def build_graph(plan: list[AIMessage], saver: SqliteSaver | None) -> Any:
    """The agent graph; the agent answers ``plan[0]``, ``plan[1]``, ... (the last repeats)."""
    turn = [0]

    def agent(state: MessagesState) -> dict[str, list[Any]]:
        message = plan[min(turn[0], len(plan) - 1)]
        turn[0] += 1
        return {"messages": [message]}

    def tools(state: MessagesState) -> dict[str, list[Any]]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        call = last.tool_calls[0]
        text = tool_output(call["args"]["query"])
        return {"messages": [ToolMessage(content=text, tool_call_id=call["id"], name=TOOL_NAME)]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def plan_for(n: int) -> list[AIMessage]:
    """The model's answers for turns 1..n: n-1 tool calls, then text."""
    calls = [
        AIMessage(
            content="",
            tool_calls=[{"name": TOOL_NAME, "args": tool_arguments(t), "id": call_id(t)}],
        )
        for t in range(1, n)
    ]
    return [*calls, AIMessage(content=FINAL_TEXT)]


def config(n: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": THREAD}, "recursion_limit": 2 * n + 10}


def open_saver(db: str) -> tuple[sqlite3.Connection, SqliteSaver]:
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    return conn, saver


def stored_bytes(conn: sqlite3.Connection, db: str) -> int:
    """Bytes of the database and its WAL after a checkpoint of the WAL."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in (Path(db), Path(f"{db}-wal")) if p.exists())


def run(variant: str, n: int, db: str) -> dict[str, Any]:
    """One run of ``n`` turns; the clock covers ``invoke`` only."""
    conn, saver = open_saver(db) if variant == "sqlite" else (None, None)
    graph = build_graph(plan_for(n), saver)
    kwargs: dict[str, Any] = {"durability": "sync"} if saver is not None else {}
    gc.collect()
    cpu = time.process_time()
    began = time.perf_counter()
    result = graph.invoke({"messages": [HumanMessage(content=USER_TEXT)]}, config(n), **kwargs)
    seconds = time.perf_counter() - began
    cpu = time.process_time() - cpu
    assert len(result["messages"]) == 2 * n, len(result["messages"])
    size = None
    if conn is not None:
        size = stored_bytes(conn, db)
        conn.close()
    return {"seconds": seconds, "cpu": cpu, "bytes": size}


def resume(db: str) -> dict[str, Any]:
    """Load the thread, add a user message, run one more (text) turn."""
    conn, saver = open_saver(db)
    graph = build_graph([AIMessage(content=FINAL_TEXT)], saver)
    gc.collect()
    began = time.perf_counter()
    result = graph.invoke(
        {"messages": [HumanMessage(content=RESUME_TEXT)]}, config(1), durability="sync"
    )
    seconds = time.perf_counter() - began
    assert result["messages"][-1].content == FINAL_TEXT
    conn.close()
    return {"seconds": seconds}


def empty(db: str) -> dict[str, Any]:
    conn, _ = open_saver(db)
    size = stored_bytes(conn, db)
    conn.close()
    return {"bytes": size}


def serve() -> None:
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "run":
            answer = run(command["variant"], command["n"], command["db"])
        elif command["op"] == "resume":
            answer = resume(command["db"])
        elif command["op"] == "empty":
            answer = empty(command["db"])
        else:
            break
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["once"]:
        run("sqlite", int(sys.argv[2]), sys.argv[3])
    else:
        print(json.dumps({"langgraph": version("langgraph")}), flush=True)
        serve()
