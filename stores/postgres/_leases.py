"""Who holds a run in the Postgres store, and when another owner may take it.

A run's lease row is the truth: its token, its owner and when it expires on the
server's clock. The owner renews it; once it has expired, anyone may take the run,
whatever else is true (a machine that vanished without closing its connections keeps
its session, and its lock, for as long as TCP keepalive lets it: hours).

The row also says how its owner proves it is alive (``proof``):

- ``lock``: the owner's process holds the session-level advisory lock ``lock_key`` on
  a connection of its own (``_owners``). A held lock proves the owner alive. A free
  lock does not prove it dead: the server ends a live owner's session when it restarts,
  fails over, when ``pg_terminate_backend`` or ``idle_session_timeout`` ends it, when a
  proxy drops it. So a taker that finds the lock free only marks the row ``suspect``
  (the server's time, committed) and is told the run is busy; the owner, which takes
  its lock again on a new session at once, clears the mark by renewing or by holding
  the lock when the next taker looks. Once the mark is ``GRACE`` seconds old (on the
  server's clock) and the lock is still free, the owner is gone and the run is taken:
  a SIGKILLed process's runs move within about a second.
- ``renewal``: nothing but renewals proves the owner alive (behind PgBouncer in
  transaction mode no session lasts): the run is taken once the lease expires. Every
  client reads the row's own proof, so a plain client beside a PgBouncer owner waits
  for the expiry too.

Before a model or tool call starts, an owner whose row says ``lock`` makes sure its
last renewal that succeeded began less than ``EFFECT_WINDOW`` seconds ago (half of
``GRACE``), renewing first otherwise (``PostgresStore.effect_window``). A renewal clears
the mark, so any mark a taker later counts from was set after it: the taker cannot
take the run before the renewal's start plus ``GRACE``, by when the effect has started.
A renewal refused because the run moved on is ``LeaseLost``: nothing starts.

A new token is one more than the larger of the row's token and the run's ``fence``,
the largest token a commit of the run carried: a lease row lost or deleted never
hands out a token an effect has seen.
"""

from __future__ import annotations

from typing import Any

import attrs

from statekernel.errors import LeaseLost, RunBusy, RunNotFound
from statekernel.stores._host.lease_records import damaged_lease, host_record
from statekernel.stores._host.owners import local_owner
from statekernel.stores.postgres._ops import Tables, run_key

__all__ = [
    "EFFECT_WINDOW",
    "GRACE",
    "LOCK",
    "RENEWAL",
    "Claim",
    "Held",
    "decide",
    "fence",
    "give_back",
    "holder",
    "keep_fence",
    "renew",
    "take_free",
    "take_over",
]

GRACE = 1.0
"""Seconds (server's clock) an owner's lock must stay free after a taker first found it
free before the taker may take the run: the time a live owner has to take its lock
again on a new session."""

EFFECT_WINDOW = GRACE / 2
"""Seconds after the start of its last renewal within which a ``lock`` owner may start
an effect without renewing first."""

LOCK = "lock"
"""Proof of a lease row whose owner holds a session-level advisory lock while it lives."""

RENEWAL = "renewal"
"""Proof of a lease row whose owner is proven alive by renewals alone."""

_PROOFS = frozenset({LOCK, RENEWAL})


@attrs.frozen
class Held:
    """A run's lease row as a taker reads it, with what it saw beside it: the server's
    time ``now``, whether the owner's lock is ``held`` by some session, and the run's
    ``fence``."""

    token: int
    owner: str | None
    expires: float
    proof: str
    suspect: float | None
    fence: int
    now: float
    held: bool


@attrs.frozen
class Claim:
    """Who asks for a run's lease: ``owner``, for ``ttl`` seconds, proven alive by
    ``proof`` (``LOCK`` with its lock's ``lock_key``, or ``RENEWAL``)."""

    owner: str
    ttl: float
    proof: str
    lock_key: int | None


def decide(row: Held, claim: Claim) -> tuple[bool, float | None]:
    """(whether ``claim`` takes the run, the ``suspect`` mark the row keeps).

    An unowned or expired lease is taken. An owner of this process holds its lease
    until it expires (the lock proves nothing between owners of one process), as does
    an owner proven by renewals. A ``lock`` owner whose lock is held keeps the run (and
    any mark is cleared); one whose lock is free is marked, and taken once the mark is
    ``GRACE`` old."""
    if row.owner is None or row.expires <= row.now:
        return True, None
    if local_owner(row.owner) or row.proof != LOCK:
        return False, row.suspect
    if row.held:
        return False, None
    if row.suspect is None or row.suspect > row.now:
        return False, row.now
    return row.now - row.suspect >= GRACE, row.suspect


_HELD = """
  l.lock_key IS NOT NULL AND EXISTS (
    SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted
      AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND k.classid = ((l.lock_key >> 32) & 4294967295)::oid
      AND k.objid = (l.lock_key & 4294967295)::oid AND k.objsubid = 1)
"""
"""Whether some session holds the lock ``lock_key`` of lease row ``l``."""

_READ = f"""
SELECT l.token, l.owner, l.expires, l.proof, l.suspect, r.fence,
  extract(epoch FROM clock_timestamp())::float8, {_HELD}
FROM {{leases}} l JOIN {{runs}} r ON r.run_id = l.run_id
WHERE l.run_id = $1 FOR UPDATE OF l
"""

_LOOK = f"""
SELECT l.owner, l.expires, l.proof, extract(epoch FROM clock_timestamp())::float8, {_HELD},
  l.suspect
FROM {{runs}} r LEFT JOIN {{leases}} l ON l.run_id = r.run_id WHERE r.run_id = $1
"""


def _held(row: Any, run_id: str, where: str) -> Held:
    owner = row[1]
    if owner is not None:
        try:
            owner = bytes(owner).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise damaged_lease(run_id, where, f"owner is not UTF-8: {exc}") from exc
    record = host_record((row[0], owner, row[2]), run_id, where)
    proof, suspect, fence = row[3], row[4], row[5]
    if proof not in _PROOFS or type(fence) is not int or fence < 0:
        raise damaged_lease(run_id, where, f"it holds proof {proof!r} and fence {fence!r}")
    return Held(
        record.token, record.owner, record.expires, proof, suspect, fence, row[6], bool(row[7])
    )


async def take_over(conn: Any, t: Tables, run_id: str, claim: Claim) -> tuple[int, str | None]:
    """Give the run's lease to ``claim`` (one transaction) and return its token and the
    owner whose lease it took over (None: the lease was free, or ``claim.owner``'s own);
    ``RunBusy`` while its owner may be alive (a mark set meanwhile is committed),
    ``RunNotFound`` when there is no such run."""
    key = run_key(run_id)
    token = await take_free(conn, t, key, claim)
    if token is not None:
        return token, None
    async with conn.transaction():
        await conn.execute(
            f"INSERT INTO {t.leases} (run_id, token, owner, expires)"
            f" SELECT $1, 0, NULL, 0 WHERE EXISTS (SELECT 1 FROM {t.runs} WHERE run_id = $1)"
            " ON CONFLICT DO NOTHING",
            key,
        )
        found = await conn.fetchrow(_READ.format(leases=t.leases, runs=t.runs), key)
        if found is None:
            raise RunNotFound(run_id)
        row = _held(found, run_id, t.where)
        taken, suspect = decide(row, claim)
        if taken:
            token = max(row.token, row.fence) + 1
            await conn.execute(
                f"UPDATE {t.leases} SET token = $2, owner = $3, expires = $4::float8 + $5::float8,"
                " proof = $6, lock_key = $7, suspect = NULL WHERE run_id = $1",
                key,
                token,
                run_key(claim.owner),
                row.now,
                claim.ttl,
                claim.proof,
                claim.lock_key,
            )
            return token, None if row.owner == claim.owner else row.owner
        if suspect != row.suspect:
            await conn.execute(
                f"UPDATE {t.leases} SET suspect = $2::float8 WHERE run_id = $1", key, suspect
            )
    assert row.owner is not None
    raise RunBusy(run_id, row.owner)


async def take_free(conn: Any, t: Tables, key: bytes, claim: Claim) -> int | None:
    """Take a lease nobody holds (given back, or never taken), as ``decide`` takes it, in
    one statement; its token, or None when the row is missing, owned (expired or not:
    ``take_over`` reads it and decides, a damaged owner included) or damaged. A taker
    that waited for another's update of the row reads the row that update left (``READ
    COMMITTED``), so of two takers of a free lease one gets it."""
    token = await conn.fetchval(
        f"UPDATE {t.leases} l SET token = GREATEST(l.token, r.fence) + 1, owner = $2,"
        " expires = extract(epoch FROM clock_timestamp())::float8 + $3::float8,"
        " proof = $4, lock_key = $5, suspect = NULL"
        f" FROM {t.runs} r WHERE l.run_id = $1 AND r.run_id = l.run_id AND l.owner IS NULL"
        "  AND l.token >= 0 AND r.fence >= 0 AND l.proof IN ('lock', 'renewal')"
        " RETURNING l.token",
        key,
        run_key(claim.owner),
        claim.ttl,
        claim.proof,
        claim.lock_key,
    )
    return None if token is None else int(token)


async def renew(conn: Any, t: Tables, run_id: str, owner: str, token: int, claim: Claim) -> None:
    """Extend the lease ``token`` of ``owner`` by ``claim.ttl`` from the server's now,
    with the owner's current proof, and clear any mark; ``LeaseLost`` if it moved on."""
    done = await conn.fetchval(
        f"UPDATE {t.leases} SET proof = $5, lock_key = $6, suspect = NULL,"
        " expires = extract(epoch FROM clock_timestamp())::float8 + $4::float8"
        " WHERE run_id = $1 AND owner = $2 AND token = $3 RETURNING 1",
        run_key(run_id),
        run_key(owner),
        token,
        claim.ttl,
        claim.proof,
        claim.lock_key,
    )
    if done is None:
        raise LeaseLost(run_id, -1, str(token))


async def give_back(conn: Any, t: Tables, run_id: str, owner: str, token: int) -> None:
    """Release the lease ``token`` of ``owner`` (nothing if it moved on or the run is gone)."""
    await conn.execute(
        f"UPDATE {t.leases} SET owner = NULL, expires = 0, suspect = NULL"
        " WHERE run_id = $1 AND owner = $2 AND token = $3",
        run_key(run_id),
        run_key(owner),
        token,
    )


async def fence(conn: Any, t: Tables, run_id: str) -> int:
    """The largest token given for the run: its fence or its lease row's token."""
    row = await conn.fetchrow(
        f"SELECT r.fence, l.token FROM {t.runs} r LEFT JOIN {t.leases} l"
        " ON l.run_id = r.run_id WHERE r.run_id = $1",
        run_key(run_id),
    )
    if row is None:
        raise RunNotFound(run_id)
    return max(int(row[0]), int(row[1] or 0))


async def keep_fence(conn: Any, t: Tables, run_id: str, at_least: int) -> None:
    """Make every later token of the run larger than ``at_least``."""
    done = await conn.fetchval(
        f"UPDATE {t.runs} SET fence = GREATEST(fence, $2) WHERE run_id = $1 RETURNING 1",
        run_key(run_id),
        at_least,
    )
    if done is None:
        raise RunNotFound(run_id)


async def holder(conn: Any, t: Tables, run_id: str) -> str | None:
    """The owner holding the run while it lives, read without writing (no mark is set
    or cleared): None when its lease is free or expired on the server's clock, or when
    a ``lock`` owner's lock has been found free for ``GRACE`` (a taker would take the
    run); a lock free for less is an owner taking its lock again, or one a taker has
    yet to find gone."""
    row = await conn.fetchrow(_LOOK.format(leases=t.leases, runs=t.runs), run_key(run_id))
    if row is None:
        raise RunNotFound(run_id)
    if row[0] is None or row[1] is None or row[1] <= row[3]:
        return None
    try:
        owner = bytes(row[0]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise damaged_lease(run_id, t.where, f"owner is not UTF-8: {exc}") from exc
    if local_owner(owner) or row[2] != LOCK or row[4]:
        return owner
    suspect = row[5]
    return owner if suspect is None or row[3] - suspect < GRACE else None
