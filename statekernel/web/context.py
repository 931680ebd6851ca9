"""What every page and action of the web view shares: the store, the kernels, the hook
that authorizes requests, and the drives the view started in the background."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request

from statekernel import Kernel
from statekernel._front.agents import load_agent
from statekernel._front.reach import logger
from statekernel.errors import ConfigError, StatekernelError
from statekernel.stores import CheckpointStore
from statekernel.web.live import Hub
from statekernel.web.security import Csrf

__all__ = ["Authorize", "WebContext", "open_context"]

log = logger("statekernel.web")

Authorize = Callable[[Request, str, str | None], bool | Awaitable[bool]]
"""``authorize(request, action, run_id)``: may this request do ``action`` (``view`` for a
page, else the action's name) on run ``run_id`` (None: the list)? False answers 403."""

READ_ONLY_REASON = (
    "read-only: no agent was given. Driving a run needs the tools, hooks and model "
    "providers of the application that started it: start the view with --agent "
    "package.module:function (or pass agent= or a Kernel to create_app)."
)
"""What the view says where the action buttons would be, without an agent."""

ACTION_BUSY_TIMEOUT = 1.0
"""Seconds an action of a kernel the view builds waits for another process's hold on a
run before it answers "busy" (a page must not hang for the kernel's default 20 s)."""


class WebContext:
    """The store the view reads, a kernel that reads with it, and (with an agent or a
    kernel) the kernel that acts on runs; ``aclose`` stops the drives it started and
    closes what it opened."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        reader: Kernel,
        actor: Kernel | None,
        owned: list[Kernel],
        owns_store: bool,
        authorize: Authorize | None,
        store_label: str,
    ) -> None:
        self.store = store
        self.reader = reader
        self.actor = actor
        self.authorize_hook = authorize
        self.store_label = store_label
        self.hub = Hub(store)
        self.csrf = Csrf()
        self._owned = owned
        self._owns_store = owns_store
        self._drives: dict[str, asyncio.Task[None]] = {}

    @property
    def read_only_reason(self) -> str | None:
        """Why the view cannot act (None when it can)."""
        return None if self.actor is not None else READ_ONLY_REASON

    async def authorized(self, request: Request, action: str, run_id: str | None) -> bool:
        """The ``authorize`` hook's answer (True without a hook).

        Raises:
            ConfigError: the hook answered something other than a bool (``None`` from a
                missing ``return``, a string): nothing is done on such an answer.
        """
        if self.authorize_hook is None:
            return True
        answer = self.authorize_hook(request, action, run_id)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, bool):
            raise ConfigError(
                f"authorize({action!r}, {run_id!r}) must return True or False, got {answer!r}"
            )
        return answer

    def driving(self, run_id: str) -> bool:
        """Whether a drive this view started still runs ``run_id``."""
        task = self._drives.get(run_id)
        return task is not None and not task.done()

    def drive(self, run_id: str) -> None:
        """Drive ``run_id`` to rest in the background with the acting kernel (its events
        reach the pages through the store)."""
        kernel = self.actor
        if kernel is None or self.driving(run_id):
            return

        async def driving() -> None:
            try:
                async for _ in kernel.run(run_id):
                    pass
            except Exception as exc:  # busy elsewhere, a failed commit, a tool's bug: logged,
                # and the page shows the run where it stopped
                log.warning("driving run %s from the web view: %s", run_id, exc)
            finally:
                self._drives.pop(run_id, None)

        self._drives[run_id] = asyncio.get_running_loop().create_task(driving())

    async def aclose(self) -> None:
        """Stop the drives (each stops cleanly, resumable), the live feed, and close the
        kernels and the store the view opened."""
        drives = list(self._drives.values())
        for task in drives:
            task.cancel()
        for task in drives:
            with contextlib.suppress(asyncio.CancelledError, StatekernelError):
                await task
        await self.hub.aclose()
        for kernel in self._owned:
            await kernel.aclose()
        if self._owns_store:
            await self.store.aclose()


def open_context(
    store_or_kernel: CheckpointStore | Kernel | str,
    *,
    agent: Mapping[str, Any] | str | None,
    authorize: Authorize | None,
) -> WebContext:
    """The context of ``create_app``: a kernel acts when given, or when ``agent`` (its
    keyword arguments, or ``package.module:function`` returning them) is."""
    from statekernel._front.reach import open_store_to_read
    from statekernel.stores import open_store, redact_url

    owns_store = False
    label = ""
    if isinstance(store_or_kernel, Kernel):
        if agent is not None:
            raise ConfigError("give a Kernel or agent=, not both: the kernel has its tools")
        store = store_or_kernel.store
        actor: Kernel | None = store_or_kernel
    elif isinstance(store_or_kernel, str):
        # without an agent the view only reads: it upgrades no schema other releases use
        if agent is not None:
            store = open_store(store_or_kernel)
        else:
            store = open_store_to_read(store_or_kernel)
        owns_store, label = True, redact_url(store_or_kernel)
        actor = None
    elif isinstance(store_or_kernel, CheckpointStore):
        store, actor = store_or_kernel, None
    else:
        raise ConfigError(f"not a store, store URL or Kernel: {store_or_kernel!r}")
    owned: list[Kernel] = []
    if agent is not None:
        options = _agent_options(agent)
        actor = Kernel(store, **{"busy_timeout": ACTION_BUSY_TIMEOUT, **options})
        owned.append(actor)
    reader = actor if actor is not None else Kernel(store)
    if actor is None:
        owned.append(reader)
    return WebContext(
        store,
        reader=reader,
        actor=actor,
        owned=owned,
        owns_store=owns_store,
        authorize=authorize,
        store_label=label or type(store).__name__,
    )


def _agent_options(agent: Mapping[str, Any] | str) -> Mapping[str, Any]:
    if isinstance(agent, str):
        return load_agent(agent, "agent")
    if not isinstance(agent, Mapping):
        raise ConfigError(f"agent must be Kernel keyword arguments, got {type(agent).__name__}")
    return agent
