"""Child runs: a tool whose call runs another agent as a run of its own.

``delegate(...)`` builds the tool. Its call derives the child's run id from the parent
run and the call (``child_run_id``), so however often the call runs (a crash, a resume
that re-runs it) there is one child per call: the first run of the call starts the
child, every later one finds it. The child is driven by a kernel with the delegate's
tools, hooks and middleware over the parent kernel's store and providers, and commits
under its own lease, like any run. It carries its parent's tags (with the delegate's own,
which win), its own ``Limits`` and its model or ``Fallback`` chain, all given when it is
created. Its final answer is the call's result. A child that
pauses (an approval, uncertain calls, ``max_turns``...) pauses the parent with reason
``child_paused`` naming the child; after the child is resumed, resuming the parent
runs the call again, which drives the child on and takes its answer. A child that
fails is an error result.

With ``queue=`` (a Redis store) the child is not driven by the caller's process: the
call hands it to that queue's workers (``statekernel worker --queue``, started with the
child agent's tools) whenever it is not at rest, and waits for it to come to rest,
reading its head. Handing a run over twice is harmless (a worker drives a run only under
its lease, and an entry for a run at rest is acknowledged), so a re-run of the call
hands it over again rather than guessing whether a worker still has it.

Where a crash can land: the call's intent is committed before the child starts (the
tool is idempotent: a resumed parent runs it again, which finds the child); inside
the child, the child's own commits decide; after the child completed and before the
parent committed the result, the call runs again and takes the child's answer
without calling its model again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from statekernel._kernel.middleware import Middleware
from statekernel._kernel.options import check_delegate_options
from statekernel._kernel.output import DEFAULT_RETRIES, output_spec_for
from statekernel._kernel.tools import Tool, ToolContext, tool
from statekernel._records.arguments import deadline_in, plain_id, seconds
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits
from statekernel._records.messages import JSON, Message, OutputSpec
from statekernel._records.tags import MAX_TAGS
from statekernel._storage.protocol import CancelsRuns, FindsRunIds
from statekernel._storage.watching import watch
from statekernel.errors import ConflictError, InvalidTag, RunNotFound, ToolError

if TYPE_CHECKING:
    from statekernel._records.events import Event
    from statekernel._records.run import PauseInfo, Run
    from statekernel._storage.protocol import CheckpointStore

__all__ = [
    "ChildPaused",
    "CreateRun",
    "DelegateTool",
    "Parent",
    "child_run_id",
    "child_runs",
    "delegate",
    "run_tree",
]


class CreateRun(Protocol):
    """How a delegate tool creates its child run (``Kernel.start`` and ``Kernel._create``)."""

    async def __call__(
        self,
        *,
        model: str | Fallback,
        messages: Iterable[Message | str],
        context: JSON,
        run_id: str | None,
        max_turns: int | None,
        parent_run_id: str | None,
        parent_call_id: str | None,
        deadline: datetime | None = None,
        output_type: object = None,
        limits: Limits | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Run:
        """The new run."""
        ...


class Parent(Protocol):
    """What a delegate tool uses of the kernel that calls it (``Kernel`` is one).
    ``_create`` is ``start`` without the check that this process has the model's
    provider (a queued child's workers bring it)."""

    def child_kernel(
        self,
        tools: Iterable[Tool],
        *,
        hooks: object | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> Parent:
        """A kernel for the child agent over the same store and providers."""
        ...

    @property
    def store(self) -> CheckpointStore:
        """The store the kernel's runs are in."""
        ...

    async def get(self, run_id: str) -> Run:
        """The run's head."""
        ...

    def run(self, run_id: str, *messages: Message | str) -> AsyncIterator[Event]:
        """Drive the run until it rests."""
        ...

    async def submit(self, run_id: str, *, queue: str = "default", delay: float = 0.0) -> str:
        """Hand the run to the workers of ``queue``."""
        ...

    @property
    def start(self) -> CreateRun:
        """Create a run (``Kernel.start``)."""
        ...

    @property
    def _create(self) -> CreateRun:
        """Create a run without checking that this process has the model's provider."""
        ...

    async def cancel(
        self, run_id: str, reason: str = "", *, by: str | None = None, children: bool = True
    ) -> object:
        """Stop the run (``Kernel.cancel``)."""
        ...


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The run id of the child run of a call: ``<parent>.<call>`` when that is a valid
    run id, else the parent's id (shortened) and a digest of both.

    Returns:
        The child's run id; the same for the same two ids, every time.
    """
    plain = f"{parent_run_id}.{call_id}"
    if plain_id(plain):
        return plain
    digest = hashlib.sha256(f"{parent_run_id}\0{call_id}".encode()).hexdigest()[:32]
    return f"{parent_run_id[:80]}.{digest}"


class ChildPaused(Exception):
    """Raised by a delegate call whose child run is paused: the parent pauses too."""

    def __init__(self, child: Run) -> None:
        pause = child.pause
        super().__init__(f"child run {child.run_id} is paused ({pause and pause.reason})")
        self.child_run_id = child.run_id
        self.pause: PauseInfo | None = pause


@attrs.frozen
class DelegateTool(Tool):
    """A ``delegate`` tool: its calls run child runs (see ``statekernel.delegate``)."""


def delegate(
    name: str,
    description: str,
    *,
    model: str | Fallback,
    tools: Iterable[Tool] = (),
    hooks: object | None = None,
    middleware: Sequence[Middleware] = (),
    instructions: str | None = None,
    context: Mapping[str, Any] | None = None,
    max_turns: int | None = 20,
    queue: str | None = None,
    poll: float = 1.0,
    timeout: float | None = None,
    output_type: object = None,
    output_retries: int = DEFAULT_RETRIES,
    limits: Limits | None = None,
    tags: Mapping[str, str] | None = None,
) -> Tool:
    """A tool that hands a task to another agent, run as a child run of the caller.

    The model calls it with a ``task``; the child run (id ``child_run_id(run, call)``)
    starts on ``model`` (``provider/name``, or a ``Fallback`` chain of them) with
    ``instructions`` as its system message and the task as
    its user message, ``context`` as its context, and runs with ``tools``, ``hooks``
    and ``middleware`` over the parent kernel's store and providers. Its final answer
    is the call's result; while it is paused, so is the parent (``child_paused``).

    ``queue``: run the child on the workers of that queue (the store must be Redis;
    the workers bring the child agent's tools, hooks and providers) and wait for it,
    reading its head at most every ``poll`` seconds.

    ``timeout``: seconds the child run has from its start (its ``deadline``); past them
    it fails with ``DeadlineExceeded``, and the call's result is an error saying so.

    ``output_type`` and ``output_retries``: the child's typed final answer, as for
    ``Kernel.start``; the call's result is then that JSON object.

    ``limits``: the child run's own ``Limits`` (the parent's are not inherited): a child
    that reaches one pauses (``limit_reached``), and so its parent (``child_paused``);
    ``Kernel.resume(child_run_id, limits=...)`` raises it, then resuming the parent goes on.
    ``tags``: the child run carries its parent's tags (as they were when the call
    started) with these set over them (the delegate's value wins for a key both have).

    Returns:
        The tool, taking one ``task`` argument; it is idempotent (a call run again finds
            the child run it started).

    Raises:
        InvalidArgument: ``model`` is not a non-empty str or a ``Fallback``, ``limits``
            not None or a ``Limits``, or ``instructions``, ``context``, ``max_turns``,
            ``queue`` or ``poll`` is of the wrong type or value.
        InvalidTag: a tag of ``tags`` against the rules, or more than a run carries.
        ConfigError: no JSON Schema of an object describes ``output_type``.
    """
    child_tools = list(tools)
    own_tags = check_delegate_options(
        model, instructions, context, max_turns, queue, poll, limits, tags
    )
    spec = None if output_type is None else output_spec_for(output_type, output_retries)
    if timeout is not None:
        deadline_in(seconds("timeout", timeout), "timeout")  # in range now, not at each call
    shape = _Child(model, instructions, context, max_turns, timeout, spec, limits, own_tags)

    async def run_child(task: str, ctx: ToolContext) -> JSON:
        parent = ctx.kernel
        if parent is None:
            raise ToolError(f"{name} runs child runs: it must be called by a Kernel")
        child = parent.child_kernel(child_tools, hooks=hooks, middleware=middleware)
        run_id = child_run_id(ctx.run_id, ctx.call_id)
        try:
            queued = queue is not None  # its workers bring the provider, not this process
            await _start_once(child, run_id, task, ctx, shape, queued)
            await _unless_parent_cancelled(child, ctx.run_id, run_id)
            if queue is None:
                async for _ in child.run(run_id):
                    pass
                done = await child.get(run_id)
            else:
                done = await _on_workers(child, run_id, queue, poll)
        finally:
            await child.aclose()
        return _answer(done)

    run_child.__doc__ = f"""{description}

    Args:
        task: What the {name} agent should do, with everything it needs to know.
    """
    built = tool(name=name, description=description, idempotent=True)(run_child)
    return DelegateTool(**attrs.asdict(built, recurse=False))


@attrs.frozen
class _Child:
    """What a delegate's child runs are made of (its options, checked)."""

    model: str | Fallback
    instructions: str | None
    context: Mapping[str, Any] | None
    max_turns: int | None
    lifetime: float | None
    spec: OutputSpec | None
    limits: Limits | None
    tags: Mapping[str, str]

    def tags_under(self, parent_tags: Mapping[str, str], run_id: str) -> dict[str, str]:
        """The child's tags: its parent's with the delegate's set over them."""
        merged = {**parent_tags, **self.tags}
        if len(merged) > MAX_TAGS:
            raise InvalidTag(
                f"child run {run_id!r} would carry {len(merged)} tags (its parent's with the"
                f" delegate's); a run carries at most {MAX_TAGS}"
            )
        return merged


async def _start_once(
    kernel: Parent, run_id: str, task: str, ctx: ToolContext, child: _Child, queued: bool
) -> None:
    """Start the child unless it exists (a call run again finds the one it started); a
    child for a queue's workers is started without asking whether this process has its
    model's provider."""
    try:
        await kernel.get(run_id)
        return
    except RunNotFound:
        pass
    messages = [Message.system(child.instructions)] if child.instructions else []
    messages.append(Message.user(task))
    create = kernel._create if queued else kernel.start
    lifetime = child.lifetime
    with contextlib.suppress(ConflictError):  # another attempt of this call started it
        await create(
            model=child.model,
            messages=messages,
            context=dict(child.context or {}),
            run_id=run_id,
            max_turns=child.max_turns,
            parent_run_id=ctx.run_id,
            parent_call_id=ctx.call_id,
            deadline=None if lifetime is None else deadline_in(lifetime, "timeout"),
            output_type=child.spec,
            limits=child.limits,
            tags=child.tags_under(ctx.tags, run_id),
        )


async def _unless_parent_cancelled(kernel: Parent, parent_id: str, run_id: str) -> None:
    """A cancel of the parent kept before its child existed did not find the child: the
    child is cancelled with it here, before it runs anything (``ToolError``)."""
    store = kernel.store
    asked = await store.cancel_request(parent_id) if isinstance(store, CancelsRuns) else None
    if asked is not None:
        await kernel.cancel(run_id, asked.reason, by=asked.by)
        raise ToolError(
            f"run {parent_id!r} is being cancelled: its child run {run_id!r} was cancelled with it"
        )


async def _on_workers(kernel: Parent, run_id: str, queue: str, poll: float) -> Run:
    """Hand the child to the workers of ``queue`` unless it is at rest, then wait until
    it is: its head is read again at each notice of a commit of the child (on a store
    with a feed of its own, ``statekernel.stores.watch``), and at least every ``poll``
    seconds (after 0.05 s, then less and less often)."""
    async with watch(kernel.store, run_id, poll=poll) as notices:
        run = await kernel.get(run_id)
        if not run.is_terminal:
            await kernel.submit(run_id, queue=queue)
        delay = 0.05
        while not run.is_terminal:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await anext(notices)
            delay = min(delay * 1.5, poll)
            run = await kernel.get(run_id)
        return run


def _answer(child: Run) -> JSON:
    if child.state == "completed":
        return child.output
    if child.state == "paused":
        raise ChildPaused(child)
    failure = child.failure
    why = f"{failure.error}: {failure.message}" if failure else child.state
    raise ToolError(f"child run {child.run_id} failed: {why}")


async def child_runs(
    store: CheckpointStore, run: Run, *, delegates: Callable[[str], bool] | None = None
) -> list[Run]:
    """The child runs of ``run``'s tool calls, in call order: of every call, or of the
    calls whose tool name ``delegates`` accepts (calls without a child are left out)."""
    named = await _named_after(store, run.run_id)
    if named is not None and not named:
        return []  # no run is named after it: its turns need not even be read
    turns = [*run.turns, *([run.current_turn] if run.current_turn else [])]
    found = []
    for turn in turns:
        answer = turn.result.message if turn.result else turn.partial  # partial: cut off
        for model_call in answer.tool_calls if answer else ():
            if delegates is not None and not delegates(model_call.name):
                continue
            child = child_run_id(run.run_id, model_call.id)
            if named is not None and child not in named:
                continue
            with contextlib.suppress(RunNotFound):
                found.append(await store.load(child))
    return found


CHILD_LOOKUP_LIMIT = 10_000
"""Ids a store that finds runs by prefix returns for one run's children; with more, the
children are looked up one call at a time."""


async def _named_after(store: CheckpointStore, run_id: str) -> set[str] | None:
    """The ids of the runs whose id starts as ``run_id``'s child runs' ids do (both forms
    of ``child_run_id`` start with its first 80 characters), when the store finds runs
    by prefix (``FindsRunIds``); else None."""
    if not isinstance(store, FindsRunIds):
        return None
    ids = await store.run_ids(run_id[:80], limit=CHILD_LOOKUP_LIMIT + 1)
    return None if len(ids) > CHILD_LOOKUP_LIMIT else set(ids) - {run_id}


async def run_tree(store: CheckpointStore, run_id: str) -> list[tuple[int, Run]]:
    """The run and its descendants, depth first, each with its depth (the run's is 0)."""
    tree: list[tuple[int, Run]] = []
    stack = [(0, await store.load(run_id))]
    while stack:
        depth, run = stack.pop()
        tree.append((depth, run))
        children = await child_runs(store, run)
        stack.extend((depth + 1, child) for child in reversed(children))
    return tree
