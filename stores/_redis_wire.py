"""One round trip of raw Redis commands: the commit path's lean pipeline.

A commit sends a few commands (index moves, the announcement, the commit script)
and reads their replies. ``redis.asyncio``'s ``Pipeline`` does per-command
bookkeeping (command stack, response callbacks, packing in Python) that costs as
much client CPU as the rest of the commit; this packs the commands with hiredis,
writes them once and reads the raw replies straight from a pooled connection.
Error replies come back as exception objects, in place (like
``execute(raise_on_error=False)``). A cancellation or an
error mid-way drops the connection (its replies would be out of step); a
connection cut (a server that closed an idle connection, a restart) is retried
once on a new connection, as ``redis.asyncio`` does: only commands that are safe
to send twice belong here (the commit script compares and sets; index moves only
ever raise scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Command", "round_trip"]

Command = tuple[Any, ...]
"""A command and its arguments, e.g. ``("ZADD", key, "GT", score, member)``."""

_CUT = (RedisConnectionError, RedisTimeoutError, OSError)


async def round_trip(client: aioredis.Redis, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` in one write and return their raw replies in order."""
    try:
        return await _once(client, commands)
    except _CUT:
        return await _once(client, commands)


async def _once(client: aioredis.Redis, commands: Sequence[Command]) -> list[Any]:
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
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
    finally:
        await pool.release(conn)
    return replies
