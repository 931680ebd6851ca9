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

``on_node`` sends commands on one connection to the server that holds a key (on a
Redis Cluster, the primary of the key's slot, on a connection of the Wire's own): what
a ``WAIT`` among them counts is the writes before it on that very connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, MovedError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["FAILURES", "Command", "Wire", "initialized", "transaction"]

Command = tuple[Any, ...]
"""A command and its arguments, e.g. ``("ZADD", key, "GT", score, member)``."""

FAILURES = (RedisError, RedisClusterException, OSError)
"""What a call to Redis raises when it fails: ``redis-py``'s errors (those of a Redis
Cluster client, such as no reachable seed node, are ``RedisClusterException``, not
``RedisError``) and the socket's. The store raises each as ``StoreError``."""

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
    of its slot) gets its own pipeline for ``round_trip``; ``on_node`` makes connections
    like those of the node it sends to.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool: Any = client.connection_pool if isinstance(client, Redis) else None
        self._idle: list[AbstractConnection] = []
        self._node_idle: dict[str, list[AbstractConnection]] = {}

    @property
    def cluster(self) -> bool:
        """Whether the client is a Redis Cluster's."""
        return self._pool is None

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

    async def on_node(self, key: str, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write on one connection to the server that holds
        ``key`` and return their replies in order (errors in place).

        On a Redis Cluster that is the primary of the key's slot, as the client's slot
        map says; when the connection is cut or the first command is redirected (the slot
        moved: a failover), the map is read again from the cluster and the commands are
        sent once more, to the node it names now.
        """
        if self._pool is None:
            await initialized(self._client)
            try:
                replies = await self._node_once(key, commands)
            except _CUT:
                await self._client.nodes_manager.initialize()
                return await self._node_once(key, commands)
            if replies and isinstance(replies[0], MovedError | AskError):
                await self._client.nodes_manager.initialize()
                return await self._node_once(key, commands)
            return replies
        return await self.round_trip(commands)

    async def _node_once(self, key: str, commands: Sequence[Command]) -> list[Any]:
        node = self._client.get_node_from_key(key)
        idle = self._node_idle.setdefault(node.name, [])
        conn = idle.pop() if idle else _connection_to(node)
        replies = await _exchange(conn, commands)
        idle.append(conn)
        return replies

    async def _once(
        self, commands: Sequence[Command], conn: AbstractConnection | None
    ) -> list[Any]:
        if conn is None:
            conn = self._pool.make_connection()
        replies = await _exchange(conn, commands)
        self._idle.append(conn)
        return replies

    async def aclose(self) -> None:
        """Close the kept connections."""
        idle, self._idle = self._idle, []
        for kept in self._node_idle.values():
            idle += kept
        self._node_idle = {}
        for conn in idle:
            await conn.disconnect()


def _connection_to(node: Any) -> AbstractConnection:
    """A new connection made like those of a cluster node's own pool, which tries a
    connection once (``on_node`` reads the slot map again instead)."""
    options = {**node.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    conn: AbstractConnection = node.connection_class(**options)
    return conn


async def _exchange(conn: Any, commands: Sequence[Command]) -> list[Any]:
    """Write ``commands`` on ``conn`` (an ``AbstractConnection``) at once and read their
    replies; any failure midway drops the connection (its replies would be out of step)."""
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
    return replies
