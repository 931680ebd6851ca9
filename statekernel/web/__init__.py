"""The web view of a store's runs: watch, inspect and answer them in a browser.

``create_app(store_or_kernel, agent=..., authorize=...)`` is an ASGI app (Starlette)
to serve with ``statekernel ui`` or to mount in your own service. Needs the ``ui``
extra: ``pip install 'statekernel[ui]'``.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is part of the test extra
    raise ImportError(
        f"statekernel.web needs the ui extra ({exc.name} is missing): pip install 'statekernel[ui]'"
    ) from exc

from statekernel.web.app import create_app

__all__ = ["create_app"]
