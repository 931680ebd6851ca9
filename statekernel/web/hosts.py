"""The ``Host`` check: the view answers only requests addressed to a name it was given.

A page of another site can make a browser send requests to a view on loopback by
having its own name resolve to 127.0.0.1 (DNS rebinding); the browser then takes the
view for that site, and the page reads what it answers. Such requests carry the other
site's name in ``Host``: ``HostCheck`` answers them 400, before any of the view runs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from statekernel.errors import ConfigError

__all__ = ["LOOPBACK_HOSTS", "HostCheck", "allowed_names", "host_name"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The names a view answers by default (with any port)."""

_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")

REFUSED = (
    "unknown host: this view answers only requests addressed to the names it was given "
    "(allowed_hosts=, statekernel ui --allowed-host)"
)


def _bracketed(address: str) -> str | None:
    """``[v6]`` as its written-out form in brackets; None when it is not one."""
    try:
        return f"[{ipaddress.IPv6Address(address[1:-1]).compressed}]"
    except ValueError:
        return None


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower
    case and without the port; None when it is none of those."""
    if not header.isascii():
        return None
    header = header.lower()
    if header.startswith("["):
        end = header.find("]") + 1
        name, port = (_bracketed(header[:end]), header[end:]) if end else (None, "")
    else:
        name, colon, digits = header.partition(":")
        name, port = (name if _NAME.fullmatch(name) else None), colon + digits
    if port and (port[0] != ":" or _PORT.fullmatch(port[1:]) is None):
        return None
    return name


def allowed_names(hosts: Iterable[str] | None) -> frozenset[str]:
    """The names a view answers: ``hosts`` (names or addresses, IPv6 ones with or
    without brackets), or ``LOOPBACK_HOSTS`` for None.

    Raises:
        ConfigError: ``hosts`` is a string, empty, or holds something that is no host
            name (``*``, a URL, a name with a port or a path).
    """
    if hosts is None:
        hosts = LOOPBACK_HOSTS
    elif isinstance(hosts, str):
        raise ConfigError(f"allowed_hosts must be a list of names, not the string {hosts!r}")
    names: set[str] = set()
    for host in hosts:
        if not isinstance(host, str):
            raise ConfigError(f"allowed_hosts must hold names (str), got {host!r}")
        text = f"[{host}]" if ":" in host and not host.startswith("[") else host
        name = host_name(text)
        if name is None or ":" in text.rpartition("]")[2]:
            raise ConfigError(
                f"allowed_hosts: {host!r} is not a host name or address (no '*', scheme, "
                "port or path: the view answers the name with any port)"
            )
        names.add(name)
    if not names:
        raise ConfigError("allowed_hosts is empty: the view would answer no request")
    return frozenset(names)


class HostCheck:
    """ASGI middleware: an HTTP or WebSocket request whose ``Host`` is not one of
    ``names`` is answered 400 without reaching ``app``."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or refuse it."""
        if scope["type"] in ("http", "websocket"):
            name = host_name(Headers(scope=scope).get("host", ""))
            if name not in self.names:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await PlainTextResponse(REFUSED, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)
