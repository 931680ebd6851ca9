"""Driving a run from the command line: the live view, crash simulation and resume."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs
from rich.console import Console
from rich.markup import escape
from rich.status import Status

from statekernel._cli.common import Output, UserError
from statekernel._cli.demo import demo_kernel, is_demo_run
from statekernel._cli.view import EventPrinter, short
from statekernel._cli.visible import visible
from statekernel._kernel.kernel import Kernel
from statekernel._records.events import Event
from statekernel._records.pauses import Uncertain
from statekernel._records.run import UNCERTAIN, Run
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import ConflictError

__all__ = ["CrashPoint", "ModelWait", "drive", "kernel_for_run", "resume_run"]


@attrs.frozen
class CrashPoint:
    """Kill the process right after the ``nth`` persisted event of type ``event``."""

    event: str
    nth: int = 1


def _crash(event_type: str, run_id: str, revision: int, hint: str, out: Output) -> None:
    out.console.print()
    then = (
        f"The run had completed: nothing is left to resume (statekernel runs show {run_id})."
        if event_type == "run_completed"
        else f"Finish the run with: {hint}"
    )
    out.errors.print(
        "[bold red]crash:[/bold red] "
        + escape(
            f"killing this process right after {event_type} "
            f"(run {visible(run_id)}, revision {revision}).\n{visible(then, layout=True)}"
        )
    )
    sys.stdout.flush()
    sys.stderr.flush()
    if hasattr(signal, "SIGKILL"):
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


async def drive(
    kernel: Kernel,
    run_id: str,
    out: Output,
    *,
    crash: CrashPoint | None = None,
    crash_hint: str = "",
    messages: Sequence[str] = (),
) -> Run:
    """Run ``run_id`` until it rests, showing its events; returns the run at rest.

    ``messages`` are new user input, committed with the first commit of the drive.
    """
    printer = EventPrinter(out.console)
    waiting = ModelWait(out.errors, (await kernel.get(run_id)).model)
    seen = 0
    try:
        async for event in kernel.run(run_id, *messages):
            waiting.saw(event)
            if out.as_json:
                out.json(event, lines=True)
            else:
                printer.show(event)
            if crash is not None and event.persisted and event.type == crash.event:
                seen += 1
                if seen == crash.nth:
                    waiting.stop()
                    _crash(event.type, run_id, event.revision, crash_hint, out)
    finally:
        waiting.stop()
    printer.close()
    return await kernel.get(run_id)


class ModelWait:
    """A spinner on a terminal's stderr while a model call has produced nothing yet (a
    local model loads, a hosted one thinks): from ``model_started`` to the next event."""

    def __init__(self, console: Console, model: str) -> None:
        self.console = console
        self.model = model
        self.status: Status | None = None

    def saw(self, event: Event) -> None:
        """Follow the run: start at a model call's intent, stop at anything else."""
        self.stop()
        if event.type in ("model_started", "model_restarted") and self.console.is_terminal:
            self.status = self.console.status(escape(f"waiting for {visible(self.model)}..."))
            self.status.start()

    def stop(self) -> None:
        """Take the spinner away (nothing if none runs)."""
        if self.status is not None:
            self.status.stop()
            self.status = None


def _tools_of(run: Run) -> list[str]:
    turns = (*run.turns, *([run.current_turn] if run.current_turn else []))
    return sorted({spec.name for turn in turns for spec in turn.request.tools})


def kernel_for_run(
    run: Run, store: CheckpointStore, agent: Mapping[str, Any] | None = None
) -> Kernel:
    """A kernel able to drive ``run`` from here: the demo's for demo runs, else one with
    the ``agent``'s keyword arguments (tools, hooks, providers) or the built-in
    providers and no tools; a run whose tools the kernel lacks is refused."""
    if is_demo_run(run) and not agent:
        kernel = demo_kernel(store)
    else:
        kernel = Kernel(store, **(agent or {}))
        missing = [name for name in _tools_of(run) if name not in kernel.tools]
        if missing:
            raise UserError(
                f"run {run.run_id} uses tools ({', '.join(missing)}) defined by the application "
                "that started it; pass --agent package.module:function to provide them"
            )
    if run.model.startswith("local/") and importlib.util.find_spec("xllamacpp") is None:
        raise UserError(f"run {run.run_id} runs on {run.model}: pip install 'statekernel[local]'")
    kernel.registry.get(run.model)  # an unknown provider fails here, before the run moves
    return kernel


def _check_resumable(run: Run, flags: str = "") -> None:
    if run.state == "completed":
        raise UserError(
            f"run {run.run_id} is completed: nothing to resume (fork it, or send new input)"
        )
    pause = run.pause
    if run.state == "paused" and pause is not None and isinstance(pause.details, Uncertain):
        open_calls = [f"{c.id} ({c.name})" for c in pause.details.unresolved]
        if not open_calls:
            return  # all answered, the resume that follows was lost in a crash: go on
        raise UserError(
            f"run {run.run_id} is paused on tool calls that may or may not have run: "
            f"{', '.join(open_calls)}; say what happened with: statekernel runs resolve "
            f"{run.run_id} CALL_ID --output JSON | --error TEXT | --rerun{flags}"
        )


async def resume_run(
    store: CheckpointStore,
    run_id: str,
    out: Output,
    *,
    max_turns: int | None = None,
    value: tuple[Any, ...] = (),
    agent: Mapping[str, Any] | None = None,
    flags: str = "",
) -> Run:
    """Resume a paused run (handing it ``value[0]`` when a value was given), retry a
    failed one or continue an interrupted one, to rest. ``flags`` (``--store ...``)
    complete the commands it suggests."""
    run = await store.load(run_id)
    _check_resumable(run, flags)
    async with _acting_on(kernel_for_run(run, store, agent), run_id) as kernel:
        if run.state == "paused":
            answer = {"value": value[0]} if value else {}
            await kernel.resume(run_id, max_turns=max_turns, **answer)
        elif run.state == "failed":
            await kernel.retry(run_id)
        elif max_turns is not None or value:
            raise UserError("--max-turns and --value apply to paused runs only")
        what = "demo run" if is_demo_run(run) else "run"
        note = f"resuming {what} {run_id} from {run.state} (revision {run.revision})"
        out.note(visible(note), markup=False)
        return await drive(kernel, run_id, out)


async def send_run(
    store: CheckpointStore,
    run_id: str,
    text: str,
    out: Output,
    *,
    agent: Mapping[str, Any] | None = None,
) -> Run:
    """Add a user message to a run at rest (completed, paused or failed) and drive it."""
    run = await store.load(run_id)
    async with _acting_on(kernel_for_run(run, store, agent), run_id) as kernel:
        note = f"sending to run {run_id} ({run.state} at revision {run.revision})"
        out.note(visible(note), markup=False)
        return await drive(kernel, run_id, out, messages=[text])


@contextlib.asynccontextmanager
async def _acting_on(kernel: Kernel, run_id: str) -> AsyncIterator[Kernel]:
    """``kernel``, closed after the block; losing the run to another process inside it
    is a ``UserError`` saying so."""
    try:
        yield kernel
    except ConflictError as exc:
        raise UserError(
            f"run {run_id} moved on in another process (store at revision {exc.actual}): "
            "someone else is driving it"
        ) from exc
    finally:
        await kernel.aclose()


def summary_line(run: Run, flags: str = "") -> str:
    """One line saying where a run came to rest (its stored text ``visible``, no rich
    markup: print it with ``markup=False``); ``flags`` (``--store ...``) complete the
    commands it suggests."""
    line = f"run {visible(run.run_id)}: {visible(run.state)} at revision {run.revision}"
    if run.pause is not None:
        line += f" ({visible(run.pause.reason)})"
        if run.pause.reason == UNCERTAIN:
            line += (
                f"\n  say what happened: statekernel runs resolve {visible(run.run_id)} CALL_ID "
                f"--output JSON | --error TEXT | --rerun{flags}"
            )
    if run.failure is not None:
        line += f" ({visible(run.failure.error)}: {short(run.failure.message, 100)})"
    if run.state == "completed" and run.last_message is not None and run.last_message.text:
        line += f"\n  answer: {short(run.last_message.text, 300)}"
    return line
