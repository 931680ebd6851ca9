"""A real HTTP server (uvicorn, on a free loopback port, in a thread) serving an app."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def served(app: ASGIApp) -> Iterator[str]:
    """``app`` served on loopback while the block runs; its base URL."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        assert time.monotonic() < deadline, "the server did not start in 30 s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def answer_to_head(base: str, head: str, *, then_closed: bool = False) -> bytes:
    """Send the request head ``head`` (no body, whatever its headers say) to the server
    at ``base`` over a socket; its answer (head and body). ``then_closed``: the server
    must then close the connection. Fails after 30 s without an answer (a server
    waiting for the body, which is never sent)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer: {answer!r}"
            answer += chunk
        length = re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", answer)
        assert length is not None, answer
        while len(answer.partition(b"\r\n\r\n")[2]) < int(length.group(1)):
            chunk = sock.recv(65536)
            assert chunk, "closed in the middle of the answer"
            answer += chunk
        if then_closed:
            assert sock.recv(1) == b"", "the connection stays open"
        return answer
