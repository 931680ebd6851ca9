"""Driving a run from the command line: the live view, crash simulation and resume."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import attrs
from rich.console import Console
from rich.markup import escape
from rich.status import Status

from statekernel import Event, Kernel, Run
from statekernel._cli.common import Output, UserError, run_hint
from statekernel._cli.view import EventPrinter
from statekernel._front.limits import check_raised, limits_text, raised_limits, suggested_limit
from statekernel._front.text import short
from statekernel._front.visible import visible
from statekernel.errors import ConflictError, InvalidArgument
from statekernel.pauses import LimitReached, Uncertain
from statekernel.stores import CheckpointStore

__all__ = ["CrashPoint", "ModelWait", "checked_model", "drive", "kernel_for_run", "resume_run"]


@attrs.frozen
class CrashPoint:
    """Kill the process right after the ``nth`` persisted event of type ``event``."""

    event: str
    nth: int = 1


def _crash(event_type: str, run_id: str, revision: int, hint: str, shown: str, out: Output) -> None:
    out.console.print()
    then = (
        f"The run had completed: nothing is left to resume ({shown})."
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
    store: str | None = None,
    agent: str | None = None,
) -> Run:
    """Run ``run_id`` until it rests, showing its events; returns the run at rest.

    ``messages`` are new user input, committed with the first commit of the drive. The
    commands it suggests (after Ctrl-C, after a simulated crash) carry ``store`` and
    ``agent`` (``--store``, ``--agent`` as given); ``crash_hint`` replaces the resume
    command a crash suggests.
    """
    resume = run_hint("resume", run_id, store, agent)
    printer = EventPrinter(out.console)
    waiting = ModelWait(out.errors, (await kernel.get(run_id)).model)
    calls = InFlight()
    seen = 0
    try:
        with interruptible(run_id, calls, out.errors, resume):
            async for event in kernel.run(run_id, *messages):
                calls.saw(event)
                waiting.saw(event)
                if out.as_json:
                    out.json(event, lines=True)
                else:
                    printer.show(event)
                if crash is not None and event.persisted and event.type == crash.event:
                    seen += 1
                    if seen == crash.nth:
                        waiting.stop()
                        shown = run_hint("show", run_id, store)
                        hint = crash_hint or resume
                        _crash(event.type, run_id, event.revision, hint, shown, out)
    finally:
        waiting.stop()
    printer.close()
    return await kernel.get(run_id)


class InFlight:
    """What a drive waits for, from its events: the model call, the tool calls running."""

    def __init__(self) -> None:
        self.model = False
        self.tools: dict[str, str] = {}
        """Call id -> tool name of the calls started and not ended."""

    def saw(self, event: Event) -> None:
        """Follow the run's events."""
        data = event.data if isinstance(event.data, dict) else {}
        call_id = str(data.get("call_id", ""))
        if event.type in ("model_started", "model_restarted"):
            self.model = True
        elif event.type in ("model_completed", "model_failed", "turn_completed"):
            self.model = False
        elif event.type == "tool_call_started" and call_id:
            self.tools[call_id] = str(data.get("name", "?"))
        elif event.type.startswith("tool_call_") and event.type != "tool_call_started":
            self.tools.pop(call_id, None)

    def describe(self) -> str:
        """What the drive waits for, in words."""
        if self.tools:
            named = ", ".join(f"{name} ({call_id})" for call_id, name in self.tools.items())
            return f"the tool call{'s' if len(self.tools) > 1 else ''} {named} to end"
        if self.model:
            return "the model call to end"
        return "the drive to stop"


@contextlib.contextmanager
def interruptible(run_id: str, calls: InFlight, errors: Console, hint: str = "") -> Iterator[None]:
    """Ctrl-C during the block stops the drive (the current task is cancelled) and says
    what it waits for (a sync tool cannot be cut short) and ``hint``, the command that
    resumes the run (by default without options); a second Ctrl-C exits at once (130),
    as a crash would: the run resumes from its last commit."""
    resume = hint or run_hint("resume", run_id, None)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    presses = 0

    def on_interrupt() -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            _exit_now(errors)
        errors.print(
            f"interrupted: stopping run {run_id}, waiting for {calls.describe()} "
            f"(Ctrl-C again to exit now; the run resumes with: {resume})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        yield
        return
    try:
        yield
    except asyncio.CancelledError:
        if presses:
            raise KeyboardInterrupt from None  # the command line's exit 130
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if presses:  # what is left (a sync tool's thread, joined at exit) ends at the next
            signal.signal(signal.SIGINT, lambda *_: _exit_now(errors))


def _exit_now(errors: Console) -> None:
    errors.print("interrupted again: exiting now", markup=False, soft_wrap=True)
    os._exit(130)


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


async def kernel_for_run(
    run: Run, store: CheckpointStore, agent: Mapping[str, Any] | None = None
) -> Kernel:
    """A kernel able to drive ``run`` from here: the demo's for demo runs, else one with
    the ``agent``'s keyword arguments (tools, hooks, providers) or the built-in
    providers and no tools; a run whose tools the kernel lacks is refused (and the
    kernel made for it closed)."""
    from statekernel._cli.demo import demo_kernel, is_demo_run  # defines tools: when needed

    if is_demo_run(run) and not agent:
        kernel = demo_kernel(store)
    else:
        kernel = Kernel(store, **(agent or {}))
    try:
        missing = [name for name in _tools_of(run) if name not in kernel.tools]
        if missing and not (is_demo_run(run) and not agent):
            raise UserError(
                f"run {run.run_id} uses tools ({', '.join(missing)}) defined by the application "
                "that started it; pass --agent package.module:function to provide them"
            )
        if run.model.startswith("local/") and importlib.util.find_spec("xllamacpp") is None:
            raise UserError(
                f"run {run.run_id} runs on {run.model}: pip install 'statekernel[local]'"
            )
        checked_model(kernel, run.model)  # an unknown provider or model fails here
    except BaseException:
        await kernel.aclose()
        raise
    return kernel


def checked_model(kernel: Kernel, model: str) -> None:
    """Refuse ``model`` before a run moves: an unknown provider, a provider that lacks
    its key, or a model its provider says it cannot serve (``check_model``)."""
    provider = kernel.registry.get(model)
    check = getattr(provider, "check_model", None)
    if callable(check):
        check(model.partition("/")[2])


def _check_resumable(run: Run, store: str | None = None, agent: str | None = None) -> None:
    if run.state == "completed":
        raise UserError(
            f"run {run.run_id} is completed: nothing to resume (fork it, or send new input)"
        )
    pause = run.pause
    if run.state == "paused" and pause is not None and isinstance(pause.details, Uncertain):
        if not pause.details.unresolved:
            return  # all answered, the resume that follows was lost in a crash: go on
        raise UserError(
            f"run {run.run_id} is paused on tool calls that may or may not have run",
            hint=uncertain_hint(run, store, agent),
        )


def uncertain_hint(run: Run, store: str | None, agent: str | None) -> str:
    """What to run for a run paused on uncertain calls: for each call, the three ways to
    say what happened to it (each a command that works as printed), then the resume."""
    pause = run.pause
    calls = pause.details.unresolved if pause and isinstance(pause.details, Uncertain) else ()
    lines = ["say what happened to each call, with one of:"]
    for c in calls:
        lines.append(f"  call {c.id} ({c.name}), attempt {c.attempt}:")
        for option, meaning in _RESOLUTIONS:
            said = run_hint("resolve", run.run_id, store, agent, c.id, *option)
            lines.append(f"    {said}   # {meaning}")
    resume = run_hint("resume", run.run_id, store, agent)
    lines.append(f"then continue the run: {resume}")
    return "\n".join(visible(line) for line in lines)


_RESOLUTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--output", '{"result": "..."}'), "it ran and returned this JSON"),
    (("--error", "what went wrong"), "it failed with this error"),
    (("--rerun",), "it did not run (or may run again): run it again"),
)


async def resume_run(
    store: CheckpointStore,
    run_id: str,
    out: Output,
    *,
    max_turns: int | None = None,
    limits: Mapping[str, int | float] | None = None,
    value: tuple[Any, ...] = (),
    agent: Mapping[str, Any] | None = None,
    store_flag: str | None = None,
    agent_flag: str | None = None,
) -> Run:
    """Resume a paused run (handing it ``value[0]`` when a value was given, with the
    limits named in ``limits`` set and its others kept), retry a failed one or continue
    an interrupted one, to rest. The commands it suggests carry ``store_flag`` and
    ``agent_flag`` (``--store``, ``--agent`` as given)."""
    run = await store.load(run_id)
    _check_resumable(run, store_flag, agent_flag)
    changes = dict(limits or {})
    if changes and run.state != "paused":
        raise UserError(f"--limit applies to paused runs only (run {run_id} is {run.state})")
    raised = raised_limits(run.limits, changes) if changes else None
    if changes:
        try:
            check_raised(run, changes)
        except InvalidArgument as exc:
            raise UserError(f"--limit: {exc}") from None
    async with _acting_on(await kernel_for_run(run, store, agent), run_id) as kernel:
        if run.state == "paused":
            answer = {"value": value[0]} if value else {}
            await kernel.resume(run_id, max_turns=max_turns, limits=raised, **answer)
            if raised is not None:
                out.note(visible(f"limits of run {run_id}: {limits_text(raised)}"), markup=False)
        elif run.state == "failed":
            await kernel.retry(run_id)
        elif max_turns is not None or value:
            raise UserError("--max-turns and --value apply to paused runs only")
        from statekernel._cli.demo import is_demo_run  # imported by kernel_for_run

        what = "demo run" if is_demo_run(run) else "run"
        note = f"resuming {what} {run_id} from {run.state} (revision {run.revision})"
        out.note(visible(note), markup=False)
        return await drive(kernel, run_id, out, store=store_flag, agent=agent_flag)


async def send_run(
    store: CheckpointStore,
    run_id: str,
    text: str,
    out: Output,
    *,
    agent: Mapping[str, Any] | None = None,
    store_flag: str | None = None,
    agent_flag: str | None = None,
) -> Run:
    """Add a user message to a run at rest (completed, paused or failed) and drive it;
    the commands it suggests carry ``store_flag`` and ``agent_flag`` as given."""
    run = await store.load(run_id)
    async with _acting_on(await kernel_for_run(run, store, agent), run_id) as kernel:
        note = f"sending to run {run_id} ({run.state} at revision {run.revision})"
        out.note(visible(note), markup=False)
        return await drive(kernel, run_id, out, messages=[text], store=store_flag, agent=agent_flag)


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


def summary_line(run: Run, store: str | None = None, agent: str | None = None) -> str:
    """One line saying where a run came to rest (its stored text ``visible``, no rich
    markup: print it with ``markup=False``); the commands it suggests carry ``--store``
    and ``--agent`` as given."""
    line = f"run {visible(run.run_id)}: {visible(run.state)} at revision {run.revision}"
    if run.pause is not None:
        line += f" ({visible(run.pause.reason)})"
        if isinstance(run.pause.details, Uncertain):
            line += "\n  " + uncertain_hint(run, store, agent).replace("\n", "\n  ")
        elif isinstance(run.pause.details, LimitReached):
            reached = run.pause.details
            raise_it = f"{reached.limit}={suggested_limit(reached)}"
            line += f"\n  {reached.limit} used {reached.used} of {reached.allowed}; raise it:"
            line += f" {run_hint('resume', run.run_id, store, agent, '--limit', raise_it)}"
    if run.failure is not None:
        line += f" ({visible(run.failure.error)}: {short(run.failure.message, 200)})"
    if run.state == "completed" and run.last_message is not None and run.last_message.text:
        line += f"\n  answer: {short(run.last_message.text, 300)}"
    return line
