"""SyncKernel: every method of Kernel from sync code, on one background loop: from a
thread pool, from a WSGI application served over HTTP, and in a forked child."""

from __future__ import annotations

import inspect
import json
import os
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

import statekernel as sk
from statekernel.blocking import SyncKernel
from statekernel.errors import InvalidArgument, RunNotFound, StatekernelError
from statekernel.testing import ScriptedProvider


def _maker(url: str) -> sk.Kernel:
    model = ScriptedProvider(["Hello."], repeat_last=True)
    return sk.Kernel(url, providers={"scripted": model})


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SyncKernel]:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with SyncKernel(lambda: _maker(url)) as made:
        yield made


def _async_methods() -> dict[str, Any]:
    return {
        name: fn
        for name, fn in inspect.getmembers(sk.Kernel)
        if not name.startswith("_")
        and (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn))
    }


def test_every_async_method_of_kernel_has_a_sync_one_taking_the_same_arguments() -> None:
    methods = _async_methods()
    assert {"start", "run", "get", "resume", "cancel", "aclose"} <= set(methods)
    for name, fn in methods.items():
        mine = getattr(SyncKernel, name, None)
        assert mine is not None, f"SyncKernel has no {name}"
        assert not inspect.iscoroutinefunction(mine)
        assert not inspect.isasyncgenfunction(mine)
        theirs = list(inspect.signature(fn).parameters.values())
        ours = list(inspect.signature(mine).parameters.values())
        assert [(p.name, p.kind, p.default) for p in ours] == [
            (p.name, p.kind, p.default) for p in theirs
        ], name
        assert f"Kernel.{name}" in (mine.__doc__ or ""), name
        returned = str(inspect.signature(mine).return_annotation)
        if inspect.isasyncgenfunction(fn):
            assert returned.startswith("Generator[Event"), (name, returned)
        else:
            assert returned == str(inspect.signature(fn).return_annotation), name


def test_runs_are_driven_from_a_thread_pool(kernel: SyncKernel) -> None:
    def one(i: int) -> tuple[str, list[str]]:
        run = kernel.start(model="scripted/m", messages=["Hi"], run_id=f"pool-{i}")
        types = [e.type for e in kernel.run(run.run_id)]
        return kernel.get(run.run_id).state, types

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(16)))
    assert [state for state, _ in results] == ["completed"] * 16
    assert all("run_completed" in types for _, types in results), results[0][1]
    assert len(kernel.events("pool-3")) > 0
    assert [depth for depth, _ in kernel.tree("pool-3")] == [0]
    with pytest.raises(RunNotFound):  # the kernel's error, raised in this thread
        kernel.get("missing")


def test_the_events_come_as_a_sync_iterator_that_closes_early(kernel: SyncKernel) -> None:
    events = kernel.start_and_run(model="scripted/m", messages=["Hi"], run_id="early")
    first = next(events)
    assert first.run_id == "early"
    events.close()  # leaving early closes the async one on the loop
    assert not kernel.holds("early")
    rest = [e.type for e in kernel.run("early")]
    assert kernel.get("early").state == "completed", rest


def test_deleting_asks_a_sync_approval(kernel: SyncKernel) -> None:
    kernel.start(model="scripted/m", messages=["Hi"], run_id="gone")
    asked: list[list[str]] = []
    assert kernel.delete("gone", approve=asked.append) == ["gone"]
    assert asked == [["gone"]]
    with pytest.raises(InvalidArgument, match="approve"):
        kernel.delete("gone", approve="yes")  # type: ignore[arg-type]


def test_close_ends_it(tmp_path: Path) -> None:
    made = SyncKernel(lambda: _maker("memory://closing"))
    made.close()
    made.close()
    with pytest.raises(StatekernelError, match="closed"):
        made.get("x")
    with pytest.raises(InvalidArgument, match="callable"):
        SyncKernel("memory://")  # type: ignore[arg-type]


def test_a_forked_child_makes_its_own(kernel: SyncKernel, tmp_path: Path) -> None:
    kernel.start(model="scripted/m", messages=["Hi"], run_id="parent")
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new loop thread and kernel, its own connections
        try:
            run = kernel.start(model="scripted/m", messages=["Hi"], run_id="child")
            list(kernel.run(run.run_id))
            said = f"{kernel.get('child').state} {kernel.get('parent').state}".encode()
            kernel.close()
        except BaseException as exc:
            said = repr(exc).encode()
        os.write(writer, said)
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        heard = pipe.read().decode()
    os.waitpid(pid, 0)
    assert heard == "completed init", heard
    assert kernel.get("child").state == "completed"  # the parent's goes on working
    assert [e.type for e in kernel.run("parent")][-1] == "run_completed"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Nothing on stderr."""


def test_a_wsgi_application_drives_runs_over_http(kernel: SyncKernel) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        run_id = environ["PATH_INFO"].strip("/")
        kernel.start(model="scripted/m", messages=["Hi"], run_id=run_id)
        for _ in kernel.run(run_id):
            pass
        body = json.dumps({"run": run_id, "state": kernel.get(run_id).state}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]

    server: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        port = server.server_address[1]
        for run_id in ("web-1", "web-2"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{run_id}", timeout=60) as got:
                assert json.loads(got.read()) == {"run": run_id, "state": "completed"}
    finally:
        server.shutdown()
        server.server_close()
        serving.join()


def test_a_call_sees_the_callers_span_so_a_run_records_its_trace(
    kernel: SyncKernel, spans: Any
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(spans))
    with app.get_tracer("app").start_as_current_span("request") as request:
        run = kernel.start(model="scripted/m", messages=["hi"])
        events = list(kernel.run(run.run_id))
    untraced = kernel.start(model="scripted/m", messages=["hi"])
    assert events[-1].type == "run_completed"
    context = request.get_span_context()
    assert run.trace_context is not None
    ids = f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    assert run.trace_context.traceparent.startswith(ids)
    assert untraced.trace_context is None
    [drive] = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert drive.parent is not None
    assert drive.parent.span_id == context.span_id  # the drive ran under the caller's span
