"""A FastAPI service around a kernel: start runs, stream their events, approve over HTTP.

One kernel per process, opened and closed by the app's lifespan (it holds the store's
connections and the leases of the runs it drives). ``POST /runs`` starts a run and
drives it in the background; ``GET /runs/{id}/events`` streams its events as
server-sent events, woken by the store's watch feed (``statekernel.stores.watch``:
pushed on PostgreSQL and Redis, polled elsewhere) and read from the store, so a run
driven by another replica streams the same; ``POST /runs/{id}/approve`` answers the
approval the run paused for and drives it on. A request for a run that another process
holds answers 409 with who holds it.

Serve it with ``uvicorn examples.fastapi_service:app`` (``STATEKERNEL_STORE`` picks the
store, a SQLite file by default; the model here is scripted, so it runs offline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

import statekernel as sk
from statekernel.errors import InvalidArgument, InvalidTransition, RunBusy, RunNotFound
from statekernel.stores import watch
from statekernel.testing import ScriptedProvider, call

AT_REST = frozenset({"paused", "completed", "failed"})


@sk.tool
def transfer_money(to: str, amount: int) -> str:
    """Send money (not idempotent: it waits for an approval)."""
    return f"sent {amount} to {to}"


class Approvals(sk.Hooks):
    """Pauses before every transfer until the run is resumed with its approval."""

    def on_tool_call_started(self, run: sk.Run, call: Any) -> sk.Pause | None:
        if call.name == "transfer_money" and run.resume_value != {"approve": call.id}:
            return sk.Pause("approval", {"call": call.id, "input": call.input})
        return None


def make_kernel(store: str) -> sk.Kernel:
    """The service's kernel: its store, tools, hooks and models."""
    model = ScriptedProvider(
        [call("transfer_money", {"to": "Bob", "amount": 50}), "Sent 50 to Bob."],
        repeat_last=True,
    )
    return sk.Kernel(
        store, tools=[transfer_money], hooks=Approvals(), providers={"scripted": model}
    )


class NewRun(BaseModel):
    """The body of ``POST /runs``."""

    message: str


class Approval(BaseModel):
    """The body of ``POST /runs/{id}/approve``: the call approved."""

    call_id: str


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    store = os.environ.get("STATEKERNEL_STORE", "sqlite:///service-runs.db")
    async with make_kernel(store) as kernel:
        app.state.kernel = kernel
        app.state.drives = set()
        yield
        for task in app.state.drives:  # the drives of this process end with it
            task.cancel()


app = FastAPI(lifespan=lifespan)


def _kernel() -> sk.Kernel:
    kernel: sk.Kernel = app.state.kernel
    return kernel


def _drive(run_id: str) -> None:
    """Drive the run to rest in the background (its events reach the stream by the store)."""

    async def drive() -> None:
        with contextlib.suppress(RunBusy):  # another replica drives it: nothing to do
            async for _ in _kernel().run(run_id):
                pass

    task = asyncio.get_running_loop().create_task(drive())
    app.state.drives.add(task)
    task.add_done_callback(app.state.drives.discard)


@app.post("/runs", status_code=201)
async def start_run(body: NewRun) -> dict[str, str]:
    run = await _kernel().start(model="scripted/bank", messages=[body.message])
    _drive(run.run_id)
    return {"run_id": run.run_id}


@app.get("/runs/{run_id}")
async def get_run(run_id: str) -> dict[str, Any]:
    try:
        run = await _kernel().get(run_id)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    pause = run.pause
    return {
        "run_id": run.run_id,
        "state": run.state,
        "revision": run.revision,
        "waiting_for": None if pause is None else {"reason": pause.reason, **pause.metadata},
        "output": run.output,
    }


@app.post("/runs/{run_id}/approve")
async def approve(run_id: str, body: Approval) -> dict[str, Any]:
    try:
        run = await _kernel().resume(run_id, value={"approve": body.call_id})
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except RunBusy as exc:
        raise HTTPException(409, str(exc)) from exc
    except (InvalidTransition, InvalidArgument) as exc:
        raise HTTPException(422, str(exc)) from exc
    _drive(run_id)
    return {"run_id": run_id, "state": run.state}


@app.get("/runs/{run_id}/events")
async def stream_events(run_id: str, after: int = -1) -> StreamingResponse:
    """Server-sent events: every stored event after revision ``after``, then each new one,
    until the run is at rest."""
    kernel = _kernel()
    try:
        await kernel.get(run_id)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from exc

    async def events() -> AsyncIterator[str]:
        last = after
        async with watch(kernel.store, run_id) as feed:
            while True:
                rested = (await kernel.get(run_id)).state in AT_REST  # before the read
                for event in await kernel.events(run_id, after_revision=last):
                    last = max(last, event.revision)
                    data = {"type": event.type, "revision": event.revision, **event.data}
                    yield f"event: {event.type}\ndata: {json.dumps(data)}\n\n"
                if rested:
                    return
                with contextlib.suppress(TimeoutError):  # a notice can be missed: look anyway
                    async with asyncio.timeout(2.0):
                        await anext(feed)

    return StreamingResponse(events(), media_type="text/event-stream")
