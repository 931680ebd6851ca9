"""The kernel: drive runs through their lifecycle, committing at effect boundaries.

How a drive moves a run (effect, transition, commit) and where a crash can land is
told at the top of ``statekernel._kernel.drive``.

One owner per run: a drive (``run``, ``step``), a command (``send``, ``resume``...) and
``delete`` first take the run's lease from the store; every commit carries its fencing
token, which the store checks with the revision. While a live owner holds the lease,
others wait up to ``busy_timeout`` and then get ``RunBusy``; they never take the owner's
intents for crash remnants. A dead owner's lease is taken over at once where the store
proves the death (an OS lock on one host), otherwise when it expires (``lease_ttl``
after its last renewal, on the server's clock on Redis; the kernel renews the leases it
holds, one loop for all of them). A command of this kernel on a run one of its drives holds
commits between two of the drive's commits, which goes on from it (``RunDriver.adopt``).
Right before a model or tool call starts, the drive checks that its lease lasts at least
``lease_margin`` more (``statekernel._kernel.tenure``). The drivers and leases a kernel
holds are kept by ``statekernel._kernel.tenancy``; the rules of resolving a pause by
``statekernel._kernel.resolving``.

Cancellation (task cancel, closing the ``run`` generator) stops between or inside
effects; the transition in progress is not committed and no ``failed`` is written.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs

from statekernel._kernel import propagation
from statekernel._kernel.cancelling import CancelResult, cancel_tree
from statekernel._kernel.commit import Committer
from statekernel._kernel.delegate import DelegateTool, child_runs, run_tree
from statekernel._kernel.diagrams import run_diagram
from statekernel._kernel.dispatch import DispatchPolicy
from statekernel._kernel.drives import check_input, drive, step
from statekernel._kernel.failures import explained
from statekernel._kernel.hooks import Hooks, check_hooks
from statekernel._kernel.middleware import Middleware
from statekernel._kernel.options import (
    check_kernel_options,
    check_kernel_parts,
    check_lease_margin,
    check_max_turns,
    check_start,
    messages_arg,
    run_deadline,
)
from statekernel._kernel.output import DEFAULT_RETRIES, output_spec_for
from statekernel._kernel.resolving import resolve_call, resume_paused
from statekernel._kernel.retention import DEFAULT_STATES, PruneResult, prune_runs
from statekernel._kernel.submitting import submit_run
from statekernel._kernel.tenancy import Tenancy
from statekernel._kernel.tools import Tool, tools_by_name
from statekernel._kernel.updates import update_context, update_tags
from statekernel._records.arguments import (
    callable_arg,
    flag,
    new_run_id_arg,
    run_id_arg,
    text,
)
from statekernel._records.events import Event
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits, check_limits, check_priced
from statekernel._records.messages import JSON, Message, OutputSpec
from statekernel._records.prices import Prices, check_prices
from statekernel._records.run import Run, StateId, utcnow
from statekernel._records.tags import check_tags
from statekernel._records.values import check_messages, checked
from statekernel._secrets import logger
from statekernel._storage.closing import Closing
from statekernel._storage.following import follow
from statekernel._storage.protocol import (
    Checkpoint,
    CheckpointStore,
)
from statekernel._storage.provider import ModelProvider
from statekernel._storage.unclosed import warn_unclosed
from statekernel.errors import (
    ConfigError,
    InvalidArgument,
)

if TYPE_CHECKING:
    from statekernel._kernel.delegate import Parent
    from statekernel.providers import ProviderRegistry

__all__ = ["Kernel"]

_log = logger(__name__)


class _NotGiven:
    """The default of an argument for which None is a value: the argument was not
    given. Signatures (and ``help``) show it as ``NOT_GIVEN``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()
"""Not given: the default of ``Kernel.start``'s ``max_turns``, ``Kernel.resume``'s
``value`` and ``Kernel.resolve_tool_call``'s ``output`` (each says what it means)."""


def _resolve_store(store: CheckpointStore | str | None) -> tuple[CheckpointStore, bool]:
    from statekernel.stores import open_store

    if store is None:
        from statekernel._storage.config import default_store_url

        return open_store(default_store_url()), True
    if isinstance(store, str):
        return open_store(store), True
    if not isinstance(store, CheckpointStore):
        raise ConfigError(f"not a checkpoint store or URL: {store!r}")
    return store, False


class Kernel(Closing):
    """Runs agents durably: every lifecycle transition is committed before the next effect.

    ``store``: a URL or a ``CheckpointStore`` (None: ``STATEKERNEL_STORE``, config
    files, then ``sqlite:///.statekernel/runs.db``). ``providers`` adds to or
    overrides the built-in providers by name. Middleware wraps model and tool calls,
    the first one outermost. ``max_turns`` is the default budget of new runs.
    ``lease_ttl``: seconds a run's lease outlives its last renewal (a dead owner's runs
    are taken over after that where the store cannot prove the death at once);
    ``busy_timeout``: seconds to wait for another live owner of a run before ``RunBusy``;
    ``lease_margin``: seconds the lease must surely last, on this process's monotonic
    clock, when a model or tool call starts (None: a third of ``lease_ttl``; the lease is
    renewed first when less remains, and nothing starts if it moved on). ``clock``: the
    monotonic clock that is measured on (``time.monotonic``; tests pass a
    ``statekernel.testing.ManualClock``). ``prices``: what each model's tokens cost
    (``"provider/name"`` to a ``statekernel.telemetry.Price``: ``Run.cost``, metrics).
    Close it (``async with`` or ``aclose()``); one collected unclosed warns
    (``ResourceWarning``).
    """

    _closed = True  # until built: a kernel whose __init__ raised holds nothing

    def __init__(
        self,
        store: CheckpointStore | str | None = None,
        *,
        tools: Iterable[Tool] = (),
        providers: Mapping[str, ModelProvider] | ProviderRegistry | None = None,
        hooks: object | None = None,
        middleware: Sequence[Middleware] = (),
        dispatch: DispatchPolicy | None = None,
        max_turns: int | None = 20,
        lease_ttl: float = 15.0,
        busy_timeout: float = 20.0,
        lease_margin: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        prices: Prices | None = None,
    ) -> None:
        from statekernel.providers import ProviderRegistry

        max_turns, lease_ttl, busy_timeout = check_kernel_options(
            max_turns, lease_ttl, busy_timeout, dispatch
        )
        tools, middleware = check_kernel_parts(
            tools, providers, middleware, registry=ProviderRegistry
        )
        self.lease_ttl = lease_ttl
        self.busy_timeout = busy_timeout
        self.lease_margin = check_lease_margin(lease_margin, lease_ttl)
        self.prices = {} if prices is None else check_prices(prices)
        self.clock = callable_arg("clock", clock)
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"
        """Who this kernel is to the stores: host, process and a kernel id."""
        self.store, self._owns_store = _resolve_store(store)
        self.tools: dict[str, Tool] = tools_by_name(list(tools))
        self.tool_specs = tuple(t.spec for t in self.tools.values())
        self.registry = (
            providers if isinstance(providers, ProviderRegistry) else ProviderRegistry(providers)
        )
        self.hooks: object = check_hooks(hooks) if hooks is not None else Hooks()
        self.middleware: tuple[Middleware, ...] = tuple(middleware)
        self.dispatch = dispatch if dispatch is not None else DispatchPolicy()
        self.max_turns = max_turns
        self._tenancy = Tenancy(self, self.store, self.owner, lease_ttl, busy_timeout, self.clock)
        """The runs this kernel drives, and their leases."""
        self._closed = False

    def __del__(self) -> None:
        if not self._closed:
            try:
                what = f"Kernel {self.owner} on {self.store!r}"
            except Exception:  # at the interpreter's exit a store's repr may not build
                what = f"Kernel {self.owner}"
            warn_unclosed(what, self)

    async def aclose(self) -> None:
        """Stop background tool calls (waiting until each has ended), release the runs'
        leases, close built-in providers and a store opened by URL."""
        self._closed = True
        await self._tenancy.close()
        await self.registry.aclose()
        if self._owns_store:
            await self.store.aclose()

    # -- creating runs -----------------------------------------------------------

    async def start(
        self,
        *,
        model: str | Fallback,
        messages: Iterable[Message | str] = (),
        context: JSON = None,
        run_id: str | None = None,
        max_turns: int | None = NOT_GIVEN,
        parent_run_id: str | None = None,
        parent_call_id: str | None = None,
        deadline: datetime | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the run's time, not this call's)
        output_type: object = None,
        output_retries: int = DEFAULT_RETRIES,
        limits: Limits | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Run:
        """Create a run at ``init`` (revision 0). Nothing runs until ``run`` is iterated.

        ``model``: ``provider/name``, or a ``Fallback`` chain of them (stored with the run).
        ``max_turns`` is the run's turn budget (None: no limit); not given, it is the
        kernel's ``max_turns``. ``limits``: what the run may use (``Limits``; reaching one
        pauses it, ``limit_reached``). ``deadline`` (an aware datetime) or ``timeout`` (seconds
        from now): past it the run stops at its next safe point, ``DeadlineExceeded``.

        ``output_type``: the final answer's type (a pydantic model, dataclass, attrs class,
        ``TypedDict`` or JSON Schema), sent back ``output_retries`` times (``output_as``).

        ``tags``: strings to find the run by (``list_runs(tags=)``, ``update_tags``);
        rules in ``InvalidTag``.

        ``parent_run_id`` and ``parent_call_id`` (both or neither) make it the child
        run of that call (``delegate`` tools start their child runs so). A model whose
        provider this kernel does not know is a ``ConfigError`` and creates nothing.

        Returns:
            The new run, at revision 0.

        Raises:
            InvalidArgument: an argument of the wrong type or value (named).
            ConfigError: the model's provider is unknown here, or ``output_type`` no type.
            ConflictError: a run with ``run_id`` exists already.
            StoreError: the store failed (after retries with backoff).
        """
        when, spec = run_deadline(deadline, timeout), _output_spec(output_type, output_retries)
        args = (model, messages, context, run_id, max_turns, parent_run_id, parent_call_id)
        run = _new_run(
            self.max_turns, *args, deadline=when, output_spec=spec, limits=limits, tags=tags
        )
        _known_models(self, run)  # an unknown provider is refused before a run exists
        await _create_run(self.store, Checkpoint.between(None, run))
        return run

    async def _create(self, **options: Any) -> Run:
        """``start`` without asking whether this kernel can call the model (a run that
        other processes drive, with providers of their own: ``_create_unchecked``)."""
        return await _create_unchecked(self, **options)

    async def start_and_run(
        self,
        *,
        model: str | Fallback,
        messages: Iterable[Message | str] = (),
        context: JSON = None,
        run_id: str | None = None,
        max_turns: int | None = NOT_GIVEN,
        raise_on_failure: bool = False,
        deadline: datetime | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the run's time, not this call's)
        output_type: object = None,
        output_retries: int = DEFAULT_RETRIES,
        limits: Limits | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Event]:
        """``start`` then ``run`` in one: create the run and drive it until it is paused,
        failed or completed, yielding its events (the first, ``run_started``, names the
        new run's id). Nothing is created until the generator is iterated.

        The commit that creates the run takes its lease with it where the store can
        (``CreatesLeased``: every built-in store), and the drive starts from the run as
        committed, without reading it back: a short run costs a lease's round trip and a
        load less than ``start`` followed by ``run``. Arguments, events and errors are
        those of ``start`` and ``run``.
        """
        flag("raise_on_failure", raise_on_failure)
        args = (model, messages, context, run_id, max_turns, None, None)
        when, spec = run_deadline(deadline, timeout), _output_spec(output_type, output_retries)
        run = _new_run(
            self.max_turns, *args, deadline=when, output_spec=spec, limits=limits, tags=tags
        )
        _known_models(self, run)
        created = Checkpoint.between(None, run)
        tenure = await self._tenancy.create(created)  # the lease taken with the run
        if tenure is None:  # a store that cannot: the run is created, its lease taken next
            await _create_run(self.store, created)
        drive_run = drive(
            self._tenancy,
            run.run_id,
            raise_on_failure=raise_on_failure,
            created=run,
            tenure=tenure,
        )
        async with contextlib.aclosing(drive_run):
            async for event in drive_run:
                yield event

    async def fork(
        self, run_id: str, *, at_revision: int | None = None, new_run_id: str | None = None
    ) -> Run:
        """A new, independent run starting from ``run_id`` as it was at ``at_revision``
        (its tags included).

        Returns:
            The new run.

        Raises:
            RunNotFound: no run has this id, or it has no revision ``at_revision``.
            StoreError: the store failed (after retries with backoff).
        """
        run_id_arg(run_id)
        source = await self.store.load(run_id, revision=at_revision)
        new_id = new_run_id if new_run_id is not None else uuid.uuid4().hex
        _check_run_id(new_id)
        now = utcnow()
        data = {"from_run_id": run_id, "from_revision": source.revision}
        event = Event("run_forked", new_id, 0, 0, data, now)
        run = attrs.evolve(source, run_id=new_id, revision=0, event_count=1, created_at=now)
        run = attrs.evolve(run, updated_at=now, trace_context=propagation.current())
        await _create_run(self.store, Checkpoint.between(None, run, (event,)))
        return run

    def child_kernel(
        self,
        tools: Iterable[Tool],
        *,
        hooks: object | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> Kernel:
        """A kernel for child runs: other tools, hooks and middleware over this kernel's
        store and providers (closing it closes neither), with its dispatch and leases."""
        return Kernel(
            self.store,
            tools=tools,
            providers=self.registry.shared(),
            hooks=hooks,
            middleware=middleware,
            dispatch=self.dispatch,
            max_turns=self.max_turns,
            lease_ttl=self.lease_ttl,
            busy_timeout=self.busy_timeout,
            lease_margin=self.lease_margin,
            clock=self.clock,
            prices=self.prices,
        )

    async def children(self, run_id: str) -> list[Run]:
        """The child runs started by the run's calls of this kernel's ``delegate`` tools,
        in call order (calls whose child was never started are left out); ``RunNotFound``.
        """
        run = await self.store.load(run_id_arg(run_id))
        return await child_runs(
            self.store, run, delegates=lambda name: isinstance(self.tools.get(name), DelegateTool)
        )

    async def delete(
        self,
        run_id: str,
        *,
        children: bool = False,
        approve: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> list[str]:
        """Delete a run with all its revisions and events; returns the ids deleted.

        A run with child runs raises ``RunHasChildren`` unless ``children=True``, which
        deletes its whole subtree (the deepest runs first). Each run is deleted under its
        lease: a run that a live owner drives is waited for (``busy_timeout``), then
        ``RunBusy`` naming the owner, and nothing more is deleted. The run's lease is held
        until it is gone, so no drive of it (and no child run it would start) comes after.

        ``approve``, when given, is awaited with the ids of the whole tree (the run first)
        once every run of it is held, so the tree it approves is the one deleted (no child
        run can start meanwhile); whatever it raises propagates and nothing is deleted.
        An application checks there, for instance, that its user may delete each child.

        Returns:
            The ids of the runs deleted, the deepest first.

        Raises:
            RunNotFound: no run has this id.
            RunHasChildren: the run has child runs and ``children`` is False.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
            InvalidArgument: ``approve`` is neither None nor callable.
            ConfigError: ``approve`` returned something that cannot be awaited.
        """
        run_id_arg(run_id)
        flag("children", children)
        if approve is not None and not callable(approve):
            raise InvalidArgument(
                f"approve must be an async function taking the list of run ids, got {approve!r}"
            )
        return await self._tenancy.delete_tree(run_id, children, self.busy_timeout, approve)

    async def prune(
        self,
        *,
        older_than: timedelta | datetime,
        states: Iterable[StateId] = DEFAULT_STATES,
        dry_run: bool = False,
        batch: int = 100,
    ) -> PruneResult:
        """Delete old runs with all their parts: each run in one of ``states`` (default
        completed and failed) last updated before ``older_than`` (a ``timedelta`` back
        from now, or an aware ``datetime``), with its child runs at any depth, as
        ``delete(run_id, children=True)`` does. A child run goes with its parent, never
        alone (unless its parent is gone). A run that someone holds, or one of whose child
        runs someone holds, is skipped at once (``held``), never waited for or cut off.
        The listing is read ``batch`` runs at a time, each page deleted before the next
        is read. ``dry_run=True`` deletes nothing and says what would go (held runs
        included: it takes no lease).
        """
        return await prune_runs(
            self.store,
            lambda rid: self._tenancy.delete_tree(rid, True, 0.0),
            older_than=older_than,
            states=states,
            dry_run=dry_run,
            batch=batch,
        )

    # -- driving -----------------------------------------------------------------

    async def run(
        self, run_id: str, *messages: Message | str, raise_on_failure: bool = False
    ) -> AsyncIterator[Event]:
        """Drive the run until it is paused, failed or completed, yielding its events.

        Starts a new run or resumes one from its last commit. Live events
        (``text_delta`` ...) are yielded as they happen, persisted ones after their
        commit. Closing the generator or cancelling the task stops the run cleanly.

        ``messages`` are new input to a run at rest, as ``send`` takes them (a string
        is a user message): ``run(run_id, "next question")`` does what ``send`` then
        ``run`` do with one load of the run, and the input lands in the drive's first
        commit (with the next turn's start), so a crash before it leaves no input.

        A run that fails ends the drive like any rest (its failure in ``run_failed`` and
        ``Run.failure``, a WARNING on the ``statekernel`` logger); with
        ``raise_on_failure=True`` the drive then raises ``RunFailed``, once the failure
        is committed and its events yielded (also for a run found failed already).

        Yields:
            Each event of the run: live ones as they happen, persisted ones after
                their commit.

        Raises:
            RunNotFound: no run has this id.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
            InvalidTransition: ``messages`` were given to a run that cannot take input.
            LeaseLost: another owner took the run over (nothing more is committed).
            StoreError: the store failed (after retries with backoff).
            RunFailed: ``raise_on_failure`` and the run is failed when the drive ends.
        """
        run_id_arg(run_id)
        flag("raise_on_failure", raise_on_failure)
        new_input = _as_messages(messages) if messages else ()
        drive_run = drive(self._tenancy, run_id, new_input, raise_on_failure=raise_on_failure)
        async with contextlib.aclosing(drive_run):  # closing this generator closes the drive
            async for event in drive_run:
                yield event

    async def step(self, run_id: str, *, raise_on_failure: bool = False) -> list[Event]:
        """Perform the effects up to the next commit and commit; returns its events.

        One step is one commit: the transitions between two effect boundaries (see
        ``run``'s note on commits); with eager dispatch, the step that reads the model's
        answer also commits the intent of each call started while the answer streamed.
        Tool calls started by a step keep running in the background; a later step
        commits their results. The step's live events (``text_delta`` ...) are among those
        returned, and reach ``statekernel.stores.follow`` readers as a drive's do (in
        other processes too, on a store with a feed).

        ``raise_on_failure=True``: raise ``RunFailed`` instead of returning when the run is
        failed after the step (its failure committed by this step or before).

        Returns:
            The events of the commit it made (none when the run is at rest).

        Raises:
            RunNotFound: no run has this id.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
            LeaseLost: another owner took the run over.
            StoreError: the store failed (after retries with backoff).
            RunFailed: ``raise_on_failure`` and the run is failed after the step.
        """
        run_id_arg(run_id)
        flag("raise_on_failure", raise_on_failure)
        return await step(self._tenancy, run_id, raise_on_failure=raise_on_failure)

    async def submit(
        self,
        run_id: str,
        *,
        queue: str = "default",
        delay: float = 0.0,
        key: str | None = None,
        key_limit: int = 1,
    ) -> str:
        """Hand the run to workers on ``queue`` of a store with run queues (Redis, PostgreSQL),
        taken after ``delay`` seconds and, with a ``key`` (a tenant, a user), while fewer than
        ``key_limit`` of its runs are in flight; the worker's drive is a child of the current span.

        Returns:
            The id of the queue entry.

        Raises:
            ConfigError: the store has no run queues.
        """
        from statekernel.stores._open import queue_schemes  # the registry, read lazily

        return await submit_run(self.store, run_id, queue, delay, (key, key_limit), queue_schemes)

    def holds(self, run_id: str) -> bool:
        """True while a drive of this kernel holds the run's lease (and has not lost it)."""
        return self._tenancy.holds(run_id)

    # -- acting on a run ---------------------------------------------------------

    async def get(self, run_id: str) -> Run:
        """The run at its last committed revision.

        Returns:
            The run's head.

        Raises:
            RunNotFound: no run has this id.
            CorruptCheckpoint: a stored record of the run fails its checksum.
        """
        return await self.store.load(run_id_arg(run_id))

    async def events(self, run_id: str, *, after_revision: int = -1) -> list[Event]:
        """The run's persisted events after ``after_revision``.

        Returns:
            The persisted events, in order.

        Raises:
            RunNotFound: no run has this id.
        """
        return await self.store.events(run_id_arg(run_id), after_revision=after_revision)

    async def watch(
        self, run_id: str, *, after_revision: int = -1, until_rest: bool = True
    ) -> AsyncIterator[Event]:
        """The run's events as they happen, whichever process drives it: the committed ones
        after ``after_revision``, each once committed, and the live ones (``text_delta``
        ...) as the driving process publishes them (from another process on Redis and
        PostgreSQL). With ``until_rest`` it ends once the run rests and every committed
        event was given. What ``statekernel.stores.follow`` gives (its bounds too).

        Raises:
            RunNotFound: no run has this id.
            StoreError: the store failed to subscribe or to read the run.
        """
        run_id_arg(run_id)
        following = follow(self.store, run_id, after_revision=after_revision, until_rest=until_rest)
        async with following as events:
            async for event in events:
                yield event

    async def tree(self, run_id: str) -> list[tuple[int, Run]]:
        """The run and its child runs (delegations), depth first, each with its depth
        (the run's is 0)."""
        return await run_tree(self.store, run_id_arg(run_id))

    async def diagram(self, run_id: str, *, format: str = "svg") -> bytes:
        """The lifecycle diagram with the states and transitions this run went through
        highlighted and its current state marked: ``svg`` (needs Graphviz: ``dot`` on
        ``PATH`` or the ``diagrams`` extra, else ``ConfigError``), ``dot`` or ``mmd``
        (Mermaid)."""
        return await run_diagram(self.store, run_id_arg(run_id), format)

    async def send(self, run_id: str, *messages: Message | str) -> Run:
        """New input (a string is a user message) to a completed or paused run.

        Returns:
            The run after the commit that took the input.

        Raises:
            RunNotFound: no run has this id.
            InvalidTransition: the run is not completed or paused, or waits on uncertain
                calls (on a failed run it names the failure and says ``retry`` resumes it).
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
        """
        run_id_arg(run_id)
        if not messages:
            raise InvalidArgument("send needs at least one message")
        async with self._tenancy.fresh(run_id) as driver:
            with explained(driver.run):
                check_input(driver.run)
                driver.stage("input", messages=_as_messages(messages))
            await driver.commit()
            return driver.run

    async def resume(
        self,
        run_id: str,
        *,
        value: JSON = NOT_GIVEN,
        max_turns: int | None = None,
        limits: Limits | None = None,
    ) -> Run:
        """Resume a paused run; ``value`` (None when not given) reaches hooks as
        ``run.resume_value``.

        A run paused with ``input_required`` (a tool asked, see ``NeedsInput``) takes
        ``value`` as the answer, which must be given: it must satisfy the question's
        schema (``InvalidArgument`` otherwise, and nothing is committed) and becomes the
        asking call's result, committed with the resume.

        ``max_turns`` raises the turn budget (a run paused for ``max_turns`` needs it);
        ``limits`` replaces the run's ``Limits`` (one paused with ``limit_reached`` needs
        the limit raised, or it pauses again before its next call).

        A run paused on uncertain calls that were all resolved (a crash came between the
        last ``resolve_tool_call`` and the resume it commits) goes on with those answers.
        A ``value`` handing in resolutions for uncertain calls (``{"resolutions": {call
        id: {"attempt", and "output", "error" or "rerun": true}}}``, as the pause's
        metadata shows them) must answer those calls' attempts in that form.

        Returns:
            The run after the commit of the resume.

        Raises:
            RunNotFound: no run has this id.
            InvalidTransition: the run is not paused, or waits on calls not yet resolved
                (on a failed run it names the failure and says ``retry`` resumes it; on a
                completed one, that ``send`` gives it new input).
            InvalidArgument: an answer that does not satisfy the question's schema, none
                where a question waits for one, or resolutions that are not resolutions
                of the uncertain calls' attempts in flight.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
        """
        run_id_arg(run_id)
        check_max_turns(max_turns)
        given, limits = value is not NOT_GIVEN, check_limits(limits)
        value = checked(value, "value") if given else None
        async with self._tenancy.fresh(run_id) as driver:
            await resume_paused(driver, value, given, max_turns, limits)
            return driver.run

    async def cancel(
        self, run_id: str, reason: str = "", *, by: str | None = None, children: bool = True
    ) -> CancelResult:
        """Stop the run from any process: it fails with ``Cancelled`` (``retry`` resumes it).

        Committed first, obeyed by whoever drives the run at its next safe point (no call
        is committed to start after it), at once for a run nobody drives; children too unless
        ``children=False``; ``by``: who asks (default ``owner``). Guide: "Cancelling runs".
        """
        run_id_arg(run_id)
        text("reason", reason, empty=True)
        who = self.owner if by is None else text("by", by)
        flag("children", children)
        return await cancel_tree(self._tenancy, run_id, reason, who, children=children)

    async def retry(self, run_id: str) -> Run:
        """Return a failed run to the state it failed in.

        Returns:
            The run after the commit of the retry.

        Raises:
            RunNotFound: no run has this id.
            InvalidTransition: the run is not failed (on a completed run it says that
                ``send`` gives it new input).
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
        """
        run_id_arg(run_id)
        async with self._tenancy.fresh(run_id) as driver:
            with explained(driver.run):
                driver.stage("retry")
            await driver.commit()
            return driver.run

    async def resolve_tool_call(
        self,
        run_id: str,
        call_id: str,
        *,
        output: JSON = NOT_GIVEN,
        error: str | None = None,
        rerun: bool = False,
    ) -> Run:
        """Say what happened to a call left in flight by a crash: exactly one of
        ``output=``, ``error=`` or ``rerun=True`` (``output=None`` is given: the call's
        output was None). When every uncertain call of the pause is resolved, the run
        resumes.

        Returns:
            The run after the commit of the resolution (resumed when it was the last).

        Raises:
            RunNotFound: no run has this id.
            InvalidTransition: the run is not paused on uncertain calls (on a failed run
                it names the failure and says ``retry`` resumes it).
            InvalidArgument: ``call_id`` is not one of its uncertain calls, or not exactly
                one of ``output``, ``error`` and ``rerun`` was given.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
        """
        run_id_arg(run_id)
        text("call_id", call_id)
        flag("rerun", rerun)
        given = (output is not NOT_GIVEN) + (error is not None) + bool(rerun)
        if given != 1:
            raise InvalidArgument("give exactly one of output=, error= or rerun=True")
        if error is not None and type(error) is not str:
            raise InvalidArgument(f"error: {type(error).__name__} is not str")
        result = None if rerun or error is not None else checked(output, "output")
        async with self._tenancy.fresh(run_id) as driver:
            await resolve_call(driver, call_id, result, error, rerun)
            return driver.run

    async def update_context(
        self, run_id: str, fn: Callable[[JSON], Any], *, attempts: int = 5
    ) -> Run:
        """Replace the run's context with ``fn(context)`` (sync or async), compare-and-set:
        ``fn`` gets a deep copy, and is called again on the newer context after a
        concurrent commit, up to ``attempts`` times (then ``ConflictError``).

        Returns:
            The run after the commit of the new context.

        Raises:
            RunNotFound: no run has this id.
            ConflictError: other commits won ``attempts`` times in a row.
            InvalidArgument: ``attempts`` below 1, or a context that is not JSON.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
        """
        return await update_context(self._tenancy, run_id, fn, attempts)

    async def update_tags(
        self,
        run_id: str,
        set: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        *,
        expected_revision: int | None = None,
    ) -> Run:
        """Set the pairs of ``set`` and remove the keys of ``remove`` from the run's tags,
        compare-and-set: committed as ``tags_updated``. With ``expected_revision`` it lands
        only on that revision; without, a concurrent commit makes it apply again to the
        newer tags (a few times). A change that changes nothing commits nothing.

        Returns:
            The run after the commit (as it was when nothing changed).

        Raises:
            RunNotFound: no run has this id.
            ConflictError: the run is not at ``expected_revision`` (or lost every attempt).
            InvalidTag: a tag against the rules, a key set and removed, over 32 tags.
            RunBusy: a live owner held the run for longer than ``busy_timeout``.
        """
        return await update_tags(self._tenancy, run_id, set, remove, expected_revision)


async def _create_unchecked(kernel: Kernel, output_type: object = None, **options: Any) -> Run:
    """``Kernel.start`` without the check that ``kernel`` has the model's provider (a
    delegate's queued child: its workers bring it); ``options`` are ``CreateRun``'s."""
    spec = _output_spec(output_type, DEFAULT_RETRIES)  # a delegate's, made already
    run = _new_run(kernel.max_turns, output_spec=spec, **options)
    await _create_run(kernel.store, Checkpoint.between(None, run))
    return run


async def _create_run(store: CheckpointStore, checkpoint: Checkpoint) -> None:
    """Commit a new run (revision 0) through the committer: an ambiguous store failure
    is settled from the head (the run is created once), one that did not land is tried
    again; ``StoreError`` when no attempt landed, ``ConflictError`` when another run has
    the id."""
    landing = await Committer(store, None, reported=False).commit(checkpoint)
    landing.unwrap()


def _new_run(
    default_turns: int | None,
    model: str | Fallback,
    messages: Iterable[Message | str],
    context: JSON,
    run_id: str | None,
    max_turns: int | None,
    parent_run_id: str | None,
    parent_call_id: str | None,
    *,
    deadline: datetime | None = None,
    output_spec: OutputSpec | None = None,
    limits: Limits | None = None,
    tags: Mapping[str, str] | None = None,
) -> Run:
    """The run ``start`` creates (revision 0), its arguments checked; ``max_turns`` not
    given is ``default_turns`` (the kernel's)."""
    if (parent_run_id is None) != (parent_call_id is None):
        raise InvalidArgument("give both parent_run_id and parent_call_id, or neither")
    chain = model if isinstance(model, Fallback) else None
    model = model.model if isinstance(model, Fallback) else model
    args = (model, messages, run_id, max_turns, parent_run_id, parent_call_id)
    check_start(*args, missing=NOT_GIVEN)
    provider, sep, name = model.partition("/")
    if not (provider and sep and name):
        raise ConfigError(f"model must look like 'provider/name', got {model!r}")
    run_id = run_id if run_id is not None else uuid.uuid4().hex
    _check_run_id(run_id)
    budget = default_turns if max_turns is NOT_GIVEN else max_turns
    now = utcnow()
    return Run(
        run_id=run_id,
        model=model,
        context=checked(context, "context") if context is not None else {},
        messages=_as_messages(messages),
        max_turns=budget,
        created_at=now,
        updated_at=now,
        parent_run_id=parent_run_id,
        parent_call_id=parent_call_id,
        deadline=deadline,
        output_spec=output_spec,
        trace_context=propagation.current(),
        limits=check_limits(limits),
        fallback=chain,
        tags={} if tags is None else check_tags(tags),
    )


def _known_models(kernel: Kernel, run: Run) -> None:
    """``ConfigError`` unless the kernel's registry knows the provider of each model
    ``run`` calls (and, for a run with a cost limit, its price table has their prices)."""
    for model in run.fallback.models if run.fallback is not None else (run.model,):
        kernel.registry.check(model)
    check_priced(run.limits, run.model, run.fallback, kernel.prices)


def _output_spec(output_type: object, retries: object) -> OutputSpec | None:
    return None if output_type is None else output_spec_for(output_type, retries)


def _as_messages(messages: Iterable[Message | str]) -> tuple[Message, ...]:
    out = []
    for m in messages_arg(messages):
        if isinstance(m, str):
            out.append(Message.user(m))
        elif isinstance(m, Message):
            out.append(m)
        else:
            raise InvalidArgument(f"not a message: {m!r}")
    check_messages(out)
    return tuple(out)


def _check_run_id(run_id: str) -> None:
    new_run_id_arg(run_id)


if TYPE_CHECKING:

    def _a_kernel_is_a_parent(kernel: Kernel) -> Parent:
        """mypy checks that ``Kernel`` is what a delegate tool calls (``ctx.kernel``)."""
        return kernel
