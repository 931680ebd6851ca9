"""Templates: Jinja2 with every value escaped, and secrets hidden before they are shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from statekernel._front.reach import redact
from statekernel._front.visible import visible
from statekernel.web.links import path_for
from statekernel.web.security import Csrf

__all__ = ["Renderer", "renderer_of"]

TEMPLATES = Path(__file__).with_name("templates")


def _shown(value: Any) -> Any:
    """What a template prints: text from a run with control characters written out
    (bidi overrides cannot make it read otherwise) and secrets replaced by ``***``;
    the template then escapes it."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return redact(visible(value, layout=True))


def _as_json(value: Any) -> str:
    """``value`` as JSON text for a page, shown as run text is (secrets as ``***``,
    control characters written out); the template escapes it."""
    return _shown(json.dumps(value, ensure_ascii=False, default=str, indent=None))  # type: ignore[no-any-return]


@jinja2.pass_context
def _url_for(context: Any, name: str, /, **params: Any) -> str:
    """The templates' ``url_for``: the path of a route (see ``path_for``)."""
    return path_for(context["request"], name, **params)


class Renderer:
    """Renders the view's pages (with the request's CSRF token)."""

    def __init__(self, csrf: Csrf) -> None:
        self.csrf = csrf
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            finalize=_shown,
            undefined=jinja2.StrictUndefined,
        )
        env.filters["as_json"] = _as_json
        env.globals["url_for"] = _url_for  # before Starlette's, which takes the Host
        self.templates = Jinja2Templates(env=env)

    def fragment(self, name: str, context: dict[str, Any]) -> str:
        """The template ``name`` as text (a part of a page sent live)."""
        return self.templates.get_template(name).render(context)

    def page(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        """The template ``name`` filled with ``context``."""
        web = request.app.state.web
        context = {
            "csrf_token": self.csrf.token(request),
            "read_only": web.read_only_reason,
            "store_label": web.store_label,
            **context,
        }
        response = self.templates.TemplateResponse(request, name, context, status_code=status)
        self.csrf.remember(request, response)
        return response


def renderer_of(request: Request) -> Renderer:
    """The renderer of the app serving ``request``."""
    renderer: Renderer = request.app.state.renderer
    return renderer
