"""A worker's health endpoint: HTTP on the worker's own event loop (uvicorn, from the
``ui`` extra), for a process supervisor or an orchestrator's probes.

- ``GET /livez``: 200 while the worker's loop runs (it is what answers) and it has not
  stopped.
- ``GET /readyz``: 200 while the worker takes work: its last round trip to the store
  (reading or reclaiming entries) succeeded and it is not stopping; 503 otherwise.
- ``GET /queue``: the depth of the worker's queue as JSON (waiting, taken, dead, the
  oldest wait), 503 when the store cannot say.

Each answer is a JSON object. It listens on loopback unless told otherwise: anyone who
reaches it learns the queue's depth.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any, Protocol

import attrs

from statekernel._storage.queues import RunQueue
from statekernel.errors import ConfigError, StoreError


class Worker(Protocol):
    """What the endpoint reads of a ``statekernel.Worker``."""

    name: str
    queue_name: str
    holding: dict[str, Any]
    ready: bool
    problem: str | None

    @property
    def alive(self) -> bool:
        """Whether it serves."""
        ...


__all__ = ["HealthServer", "Worker", "health_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def health_app(worker: Worker) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI application answering the worker's probes."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope.get("path", ""), scope.get("method", "GET")
        body: dict[str, Any]
        if method not in ("GET", "HEAD"):
            status, body = 405, {"error": "only GET"}
        elif path == "/livez":
            alive = worker.alive
            status, body = (200 if alive else 503), {"alive": alive, "worker": worker.name}
        elif path == "/readyz":
            ready = worker.ready
            status = 200 if ready else 503
            body = {"ready": ready, "worker": worker.name, "queue": worker.queue_name}
            body |= {"in_flight": len(worker.holding), "problem": worker.problem}
        elif path == "/queue":
            status, body = await _depth(worker)
        else:
            status, body = 404, {"error": "unknown path: /livez, /readyz or /queue"}
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else data})

    return app


async def _depth(worker: Worker) -> tuple[int, dict[str, Any]]:
    queue: RunQueue | None = getattr(worker, "queue", None)
    if queue is None:
        return 503, {"error": "the worker has not opened its queue yet"}
    try:
        async with asyncio.timeout(10):
            depth = await queue.depth()
    except (StoreError, TimeoutError) as exc:
        return 503, {"error": str(exc) or type(exc).__name__}
    now = int(time.time() * 1000)
    wait = None if depth.oldest_ms is None else max(now - depth.oldest_ms, 0) / 1000
    return 200, attrs.asdict(depth) | {"oldest_wait_s": wait}


class HealthServer:
    """Serves ``health_app(worker)`` on ``host:port`` in the running loop while entered
    (port 0: a free port, in ``port`` once entered)."""

    def __init__(self, worker: Worker, host: str, port: int) -> None:
        if importlib.util.find_spec("uvicorn") is None:
            raise ConfigError(
                "the worker's health endpoint needs uvicorn: pip install 'statekernel[ui]'"
            )
        self.worker = worker
        self.host = host
        self.port = port
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HealthServer:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                """The worker handles SIGTERM and SIGINT: leave them to it."""
                yield

        config = uvicorn.Config(
            health_app(self.worker),
            host=self.host,
            port=self.port,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
        )
        try:
            sock = socket.create_server((self.host, self.port))
        except OSError as exc:
            raise ConfigError(
                f"the worker's health endpoint cannot listen on {self.where}: {exc}"
            ) from exc
        self.port = int(sock.getsockname()[1])
        self._server = server = Server(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]))  # it listens already
        return self

    @property
    def where(self) -> str:
        """``host:port`` it listens on."""
        return f"{self.host}:{self.port}"

    async def __aexit__(self, *exc: object) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self._task
