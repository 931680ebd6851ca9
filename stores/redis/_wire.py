"""Round trips of raw Redis commands: the commit path's lean pipeline.

A commit sends a few commands (index moves, the announcement, the commit script)
and reads their replies. ``redis.asyncio``'s ``Pipeline`` does per-command
bookkeeping (command stack, response callbacks, packing in Python), and its pool
hands out and takes back a connection with health checks and metrics each time;
together they cost as much client CPU as the rest of the commit. A ``Wire`` packs
the commands with hiredis, writes them once and reads the raw replies on a
connection of its own, kept for the next round trip (as many as round trips run
at once). Error replies come back as exception objects, in place (like
``execute(raise_on_error=False)``). A cancellation or an error mid-way drops the
connection (its replies would be out of step); a connection cut (a server that
closed an idle connection, a restart) is retried once on a new connection, as
``redis.asyncio`` does: only commands that are safe to send twice belong here (the
commit script compares and sets; index moves only ever raise scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Command", "Wire", "initialized", "transaction"]

Command = tuple[Any, ...]
"""A command and its arguments, e.g. ``("ZADD", key, "GT", score, member)``."""

_CUT = (RedisConnectionError, RedisTimeoutError, OSError)


async def initialized(client: Any) -> None:
    """Make sure a ``RedisCluster`` client knows the cluster's nodes and slots (nothing
    to do for another client).

    ``redis-py`` initializes a cluster client at its first command, but not before its
    pub/sub looks up the node of a channel (a ``KeyError``), and its transaction
    pipeline queues each command from a thread with an event loop of its own, which
    would initialize the client there and leave it connections of a loop that is gone.
    """
    if isinstance(client, RedisCluster):
        await client.initialize()


async def transaction(client: Any) -> Any:
    """A transaction pipeline (``MULTI``/``EXEC``) of ``client``; on a Redis Cluster its
    commands must touch one hash slot."""
    await initialized(client)
    return client.pipeline(transaction=True)


class Wire:
    """Round trips on connections made like a ``redis.asyncio.Redis`` client's own (same
    server, AUTH, TLS), from its connection pool.

    Any other client (a ``RedisCluster``, whose pipeline sends each command to the node
    of its slot) gets its own pipeline instead.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool: Any = client.connection_pool if isinstance(client, Redis) else None
        self._idle: list[AbstractConnection] = []

    async def round_trip(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write and return their replies in order."""
        if self._pool is None:
            pipe = self._client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            return replies
        try:
            return await self._once(commands, self._idle.pop() if self._idle else None)
        except _CUT:
            return await self._once(commands, None)

    async def _once(
        self, commands: Sequence[Command], conn: AbstractConnection | None
    ) -> list[Any]:
        if conn is None:
            conn = self._pool.make_connection()
        try:
            if not conn.is_connected:
                await conn.connect()
            packed = b"".join([hiredis.pack_command(command) for command in commands])
            await conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:  # the reply was read whole: the stream is in step
                    replies.append(exc)
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        self._idle.append(conn)
        return replies

    async def aclose(self) -> None:
        """Close the kept connections."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()
