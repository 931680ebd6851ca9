"""Connections of the Postgres store's pool, borrowed and given back after any outcome.

asyncpg raises more than ``PostgresError``: ``InterfaceError`` for a connection it
closed or a proxy the pool detached, ``InternalClientError`` (and its ``ProtocolError``)
when its protocol is in a state it did not expect, ``OSError`` for the socket. After a
server fault the last two come often: a session the server ended while the connection
sat idle in the pool may have received the server's ``FATAL`` message and not yet its
end of stream, so the pool hands it out with that message still marked in progress,
and the next statement fails with ``cannot switch to state ...; another operation is in
progress``. ``DRIVER_ERRORS`` names them all; the store raises each as a ``StoreError``.

A connection goes back to the pool only after work that ended well or with a clean
refusal (``clean``): a SQL error the server raised in a session that goes on, or the
store's own verdict on what it read. After anything else (a lost or ending session,
the driver's protocol errors, a cancellation in the middle of a statement) its state
is in doubt, and it is terminated (``discard``): the pool opens a new one in its place
and never hands out the old one again. A failure to give a connection back discards it
too, and never turns work that ended well into an error.

The store's own pool gives a connection back without asyncpg's reset round trip
(``Reused``: a pool resets every connection it is given back, four statements, which
was a second round trip after every commit). The store's work leaves nothing in a
session: a commit or a read runs whole in one transaction or statement. The connections
that do keep something (an owner's advisory locks, a listener's ``LISTEN`` and its
watching lock, an owner's ``SET``) are given back through ``give_back_reset``, which
clears them first.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from statekernel.errors import StatekernelError
from statekernel.stores._sql.rows import BadRow

__all__ = [
    "DRIVER_ERRORS",
    "RESET",
    "Reused",
    "borrowed",
    "clean",
    "discard",
    "give_back",
    "give_back_reset",
    "lost",
]

DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    OverflowError,
)
"""What asyncpg raises for a server, a connection or a value it cannot send (``OSError``
covers the socket's errors and timeouts)."""

_SESSION_ENDS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.FatalPostgresError,
)
"""SQL errors that end the session or say the server is going away (class 08, class
57: shutdown, crash, cancellation, recovery), whatever their severity."""

_VERDICTS: tuple[type[BaseException], ...] = (StatekernelError, BadRow)
"""What the store's own code raises once the server has answered (a conflict, a lost
lease, damaged data): the session is as healthy as before."""


RESET = "SELECT pg_advisory_unlock_all(); UNLISTEN *; RESET ALL"
"""What a session that held locks, listened or set something is cleared with, in one
round trip, before its connection goes back to the store's pool."""


class Reused(asyncpg.Connection):  # type: ignore[misc]
    """A connection of the store's own pool: given back without a reset statement (the
    store clears the sessions that keep something itself, ``give_back_reset``)."""

    def get_reset_query(self) -> str:
        """Nothing to send when the pool takes the connection back."""
        return ""


def lost(conn: Any) -> bool:
    """Whether ``conn`` has ended (a pool's proxy of a connection that ended is detached
    from it and refuses every call, ``is_closed`` included)."""
    try:
        return bool(conn.is_closed())
    except Exception:
        return True


def clean(exc: BaseException) -> bool:
    """Whether ``exc`` leaves its session usable: a SQL error the server raised and
    recovered from (not one that ends the session, not ``FATAL`` or ``PANIC``), or a
    verdict of the store's own code."""
    if isinstance(exc, _VERDICTS):
        return True
    if not isinstance(exc, asyncpg.PostgresError) or isinstance(exc, _SESSION_ENDS):
        return False
    return getattr(exc, "severity", None) not in ("FATAL", "PANIC")


def discard(conn: Any) -> None:
    """End ``conn`` at once, never to be reused: the pool gets its place back and opens
    a new connection there when one is needed."""
    with contextlib.suppress(Exception):
        conn.terminate()


async def give_back_reset(pool: asyncpg.Pool, conn: Any) -> None:
    """``give_back`` a connection whose session kept something (advisory locks, a
    ``LISTEN``, a setting), cleared first (``RESET``); one that cannot be cleared is
    discarded (its session ends, and what it kept with it). Never raises, but for a
    cancellation (after discarding it)."""
    try:
        if not lost(conn):
            await conn.execute(RESET)
    except Exception:
        discard(conn)
    except BaseException:
        discard(conn)
        raise
    await give_back(pool, conn)


async def give_back(pool: asyncpg.Pool, conn: Any) -> None:
    """Give ``conn`` back to ``pool`` for reuse, or discard it: when it ended, is still
    in a transaction, or the pool refused it. Never raises, but for a cancellation
    (after discarding it)."""
    if lost(conn) or conn.is_in_transaction():
        discard(conn)
        return
    try:
        await pool.release(conn)
    except Exception:
        discard(conn)
    except BaseException:
        discard(conn)
        raise


@contextlib.asynccontextmanager
async def borrowed(pool: asyncpg.Pool) -> AsyncIterator[Any]:
    """A connection of ``pool`` for one piece of work: given back after it ended well
    or with a clean refusal (``clean``), discarded after anything else."""
    conn = await pool.acquire()
    try:
        yield conn
    except BaseException as exc:
        if clean(exc):
            await give_back(pool, conn)
        else:
            discard(conn)
        raise
    await give_back(pool, conn)
