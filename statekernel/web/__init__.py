"""The web view of a store's runs: watch, inspect and answer them in a browser.

``create_app(store_or_kernel, agent=..., authorize=...)`` is an ASGI app (Starlette)
to serve with ``statekernel ui`` or to mount in your own service. Needs the ``ui``
extra: ``pip install 'statekernel[ui]'``.
"""

from __future__ import annotations

from statekernel.web.app import create_app

__all__ = ["create_app"]
