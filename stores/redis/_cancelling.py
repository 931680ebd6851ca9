"""Connections that never lose their caller's cancellation.

redis-py sends a command under ``asyncio.wait_for`` when the connection has a socket
timeout (from redis-py 6 every connection has one by default). On Python 3.11,
``wait_for`` returns normally when the caller is cancelled in the loop turn the send
ends in: the cancellation is lost, and the task goes on as if never cancelled (a drive
told to stop ran on to the end of its run; a feed's reader could not be stopped).

``guarded(cls)`` is ``cls`` with a send that keeps it: a send that returns while a
cancellation of its task came meanwhile drops the connection (the reply of what was
sent is unread: the connection would be out of step) and raises ``CancelledError``, as
a cancellation a moment earlier does. The store's clients make their connections with
it, a Redis Cluster's on every node.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import Connection

__all__ = ["guard_client", "guarded"]

_guarded: dict[type[Any], type[Any]] = {}


def guarded(cls: type[Any]) -> type[Any]:
    """``cls`` (a redis-py async connection class) with a send that keeps a cancellation
    (one class per ``cls``; a guarded class is returned as is)."""
    if getattr(cls, "keeps_cancellation", False):
        return cls
    if cls not in _guarded:

        class Guarded(cls):  # type: ignore[misc]
            keeps_cancellation = True

            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                """``send_packed_command``, raising a cancellation that came as it sent."""
                task = asyncio.current_task()
                before = 0 if task is None else task.cancelling()
                await super().send_packed_command(command, check_health)
                if task is not None and task.cancelling() > before:
                    await self.disconnect(nowait=True)
                    raise asyncio.CancelledError

        Guarded.__name__ = Guarded.__qualname__ = cls.__name__
        _guarded[cls] = Guarded
    return _guarded[cls]


def guard_client(client: Any) -> None:
    """Make the connections ``client`` opens from now on ``guarded``: a single server's
    pool, or every node of a Redis Cluster (those it knows and those it finds)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class = guarded(pool.connection_class)
        return
    nodes = client.nodes_manager
    kwargs = nodes.connection_kwargs
    kwargs["connection_class"] = guarded(kwargs.get("connection_class", Connection))
    for node in nodes.startup_nodes.values():
        node.connection_class = guarded(node.connection_class)
