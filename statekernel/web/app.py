"""``create_app``: the web view as an ASGI application (Starlette)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from statekernel import Kernel
from statekernel.stores import CheckpointStore
from statekernel.web.actions import act
from statekernel.web.bodies import BodyLimit
from statekernel.web.context import Authorize, open_context
from statekernel.web.headers import SecurityHeaders
from statekernel.web.hosts import HostCheck, allowed_names
from statekernel.web.numbers import BadNumber
from statekernel.web.pages import bad_request, diagram_svg, run_page, runs_list
from statekernel.web.queues import queue_act, queue_page, queues_page
from statekernel.web.rendering import Renderer
from statekernel.web.streams import list_stream, run_stream

__all__ = ["create_app"]

STATIC = Path(__file__).with_name("static")


class _View(Starlette):
    """The view's Starlette app, its checks outside everything else (a 500 carries
    the security headers too)."""

    def __init__(self, *, hosts: frozenset[str], **options: Any) -> None:
        self._hosts = hosts
        super().__init__(**options)

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, inside the body bound, the ``Host`` check and the headers."""
        inner = super().build_middleware_stack()
        return SecurityHeaders(HostCheck(BodyLimit(inner), self._hosts))


def create_app(
    store_or_kernel: CheckpointStore | Kernel | str,
    *,
    agent: Mapping[str, Any] | str | None = None,
    authorize: Authorize | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The web view of a store's runs, as an ASGI app to serve (``statekernel ui``) or
    to mount in your own Starlette or FastAPI service.

    ``store_or_kernel``: a store URL (opened by the app, closed when it shuts down), a
    ``CheckpointStore``, or a ``Kernel`` (which then also acts on runs). ``agent``:
    the ``Kernel`` keyword arguments (tools, hooks, providers; or
    ``"package.module:function"`` returning them) the view acts with; with neither a
    kernel nor an agent the view is read-only and says why. ``authorize(request,
    action, run_id)`` (sync or async) answers whether a request may ``view`` a page or
    do an action (``answer``, ``resume``, ``raise_limit``, ``resolve``, ``send``,
    ``retry``, ``cancel``, ``fork``, ``delete``; ``queues`` to look at the run queues,
    with no run id, and ``requeue`` or ``drop`` of a run's queue entries, ``requeue``
    with no run id for every dead letter); False answers 403, and an answer that is not
    a bool is a ``ConfigError`` (so a hook missing its ``return`` refuses nothing
    silently). Deleting with children asks about each child run while the kernel holds
    the whole tree.
    Every action is a POST carrying a CSRF token (in its query string or the
    ``X-CSRF-Token`` header), checked with ``authorize`` before the form is read; a body
    is at most 256 KiB (413 otherwise, unread) and a form at most 200 fields, no files.

    ``allowed_hosts``: the names (or addresses) the view answers, with any port; a
    request with another ``Host`` gets a 400 and nothing of the store (a page of
    another site whose name resolves to the view's address cannot read it). Default:
    ``localhost``, ``127.0.0.1`` and ``[::1]``; serving or mounting it under another
    name, give that name. Every response forbids framing (``X-Frame-Options``, a
    ``Content-Security-Policy`` of ``default-src 'self'; frame-ancestors 'none'``) and
    sniffing, and sends referrers to the view only; its links are paths, never built
    from the request's ``Host``.

    The app's lifespan closes what it opened; mounted in another app (whose lifespan
    does not reach it) call ``await app.state.web.aclose()`` when that app stops.

    Returns:
        The Starlette application.

    Raises:
        ConfigError: ``store_or_kernel`` is no store, store URL or ``Kernel``, its URL
            is unknown or malformed, both a kernel and ``agent`` were given,
            ``agent`` cannot be loaded or is not ``Kernel`` keyword arguments, or
            ``allowed_hosts`` is empty or holds something other than a host name.
        InvalidArgument: an option in ``agent`` has the wrong type or value (as
            ``Kernel`` refuses it).
    """
    hosts = allowed_names(allowed_hosts)
    web = open_context(store_or_kernel, agent=agent, authorize=authorize)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await web.aclose()

    routes = [
        Route("/", runs_list, name="list"),
        Route("/stream", list_stream, name="list_stream"),
        Route("/runs/{run_id}", run_page, name="run"),
        Route("/runs/{run_id}/stream", run_stream, name="run_stream"),
        Route("/runs/{run_id}/diagram.svg", diagram_svg, name="diagram"),
        Route("/runs/{run_id}/{action}", act, methods=["POST"], name="act"),
        Route("/queues", queues_page, name="queues"),
        Route("/queues/{name}", queue_page, name="queue"),
        Route("/queues/{name}/{action}", queue_act, methods=["POST"], name="queue_act"),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers = {BadNumber: bad_request}
    app = _View(hosts=hosts, routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.web = web
    app.state.renderer = Renderer(web.csrf)
    return app
