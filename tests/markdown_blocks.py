"""Code blocks of the project's Markdown (README.md, docs/): found, and run as pasted.

Every fenced block is either run by a test or marked as not runnable, with a reason, by
an HTML comment on the line right before it: ``<!-- fragment: REASON -->`` (a python
block that cannot run on its own) or ``<!-- not run: REASON -->`` (any block). A python
block without a marker is written to a file of its own in a fresh folder and run in a
subprocess: with pytest when it defines ``test_*`` functions, else with python. Models
named ``openai/...`` (and ``openai-responses/...``) are served by a real local HTTP
server speaking the chat completions (and Responses API) wire format
(``OPENAI_BASE_URL``); the one address a block cannot know, the Redis server of ``Scale
out``, is replaced by the test server's. ``mermaid`` blocks are
pictures (the lifecycle diagram), checked by the tests that draw them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[1]
HUNG = 300.0
"""Seconds after which a block that should have ended is taken for hung."""
REDIS_PLACEHOLDER = "redis://redis.internal:6379/0"
FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})([\w-]*)[^`\n]*\n(.*?)^\1\2[ \t]*$", re.S | re.M)
"""A fenced block: of backticks or tildes, indented as in a list item or an admonition
(closed by the same fence at the same indent)."""
MARKER = re.compile(r"^[ \t]*<!-- (fragment|not run): (\S.*?) -->$")


@attrs.frozen
class Block:
    """One fenced block of a Markdown file."""

    path: Path
    line: int
    lang: str
    code: str
    marker: str | None
    """``fragment`` or ``not run`` when the line before marks it not runnable."""
    reason: str | None

    @property
    def id(self) -> str:
        """``file:line``, relative to the repository."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether a test runs it: an unmarked python block."""
        return self.lang == "python" and self.marker is None


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, in order."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked = MARKER.match(before)
        indent = match.group(1)
        code = "".join(
            line.removeprefix(indent) for line in match.group(4).splitlines(keepends=True)
        )
        found.append(
            Block(
                path=path,
                line=text.count("\n", 0, match.start()) + 1,
                lang=match.group(3),
                code=code,
                marker=marked.group(1) if marked else None,
                reason=marked.group(2) if marked else None,
            )
        )
    return found


def params(found: list[Block]) -> list[Any]:
    """pytest params of the blocks a test runs (``redis``-marked where they need it)."""
    redis = [pytest.mark.redis]
    return [
        pytest.param(block, id=block.id, marks=redis * (REDIS_PLACEHOLDER in block.code))
        for block in found
        if block.runs
    ]


# -- a chat completions server --------------------------------------------------------


def sample(schema: dict[str, Any]) -> Any:
    """A value of a tool parameter's JSON Schema."""
    kind = schema.get("type")
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(
        str(kind), "Paris"
    )


def answer(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The delta and finish reason of a reply: a call of the first tool offered when the last
    message is the user's, else a sentence."""
    tools = body.get("tools") or []
    if body["messages"][-1]["role"] == "user" and tools:
        function = tools[0]["function"]
        params = function.get("parameters", {})
        arguments = {
            name: sample(schema)
            for name, schema in params.get("properties", {}).items()
            if name in params.get("required", ())
        }
        call = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments)},
        }
        return {"tool_calls": [call]}, "tool_calls"
    return {"role": "assistant", "content": "It is sunny."}, "stop"


def responses_answer(body: dict[str, Any]) -> tuple[str, str]:
    """A Responses API answer (``POST /v1/responses``), its text as the chat answer's,
    streamed as the API's events or whole, and its content type."""
    text = "It is sunny."
    message: dict[str, Any] = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    response: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "model": body["model"],
        "status": "completed",
        "output": [message],
        "usage": usage,
    }
    if not body.get("stream"):
        return json.dumps(response), "application/json"
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "content": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": response},
    ]
    data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    return data, "text/event-stream"


class ChatCompletions(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``, streamed (SSE) or not, and ``POST /v1/responses``
    (a sentence, in the Responses API's wire format)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/responses"):
            data, kind = responses_answer(body)
        else:
            data, kind = self._completion(body)
        raw = data.encode()
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _completion(self, body: dict[str, Any]) -> tuple[str, str]:
        delta, finish = answer(body)
        if body.get("stream"):
            chunks = [
                {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                {
                    "choices": [],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                },
            ]
            data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            kind = "text/event-stream"
        else:
            message = {"role": "assistant", **delta}
            if "tool_calls" in message:
                message["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "index"} for c in message["tool_calls"]
                ]
            choice = {"index": 0, "message": message, "finish_reason": finish}
            data = json.dumps({"choices": [choice]})
            kind = "application/json"
        return data, kind

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def openai_url() -> Iterator[str]:
    """The base URL of a local chat completions server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatCompletions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


# -- running a block ---------------------------------------------------------------------


def run_block(
    block: Block, tmp_path: Path, openai_url: str, request: pytest.FixtureRequest
) -> None:
    """Run ``block`` as pasted in ``tmp_path``; fail the test unless it succeeds cleanly."""
    code = block.code
    if REDIS_PLACEHOLDER in code:
        code = code.replace(REDIS_PLACEHOLDER, request.getfixturevalue("redis_store_url"))
    is_test = re.search(r"^def test_", code, re.M) is not None
    script = tmp_path / ("test_block.py" if is_test else "block.py")
    script.write_text(code)
    (tmp_path / ".git").mkdir()  # the block's project root: config is not looked for above
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEKERNEL_")}
    env |= {"OPENAI_BASE_URL": openai_url, "OPENAI_API_KEY": "sk-readme-test"}
    command = [sys.executable, "-X", "dev", str(script)]
    if is_test:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)]
    try:
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HUNG
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.id}: the block never ended: {exc.stdout!r} {exc.stderr!r}")
    assert done.returncode == 0, f"{block.id}\n{done.stdout}{done.stderr}"
    assert "ResourceWarning" not in done.stderr, done.stderr
    if is_test:
        assert re.search(r"\b[1-9]\d* passed\b", done.stdout), done.stdout
