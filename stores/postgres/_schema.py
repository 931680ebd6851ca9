"""The Postgres store's tables, its layout version and the migrations between versions.

The records are those of the SQLite store (``stores/_format``: the same encoding and
checksums), so ``statekernel migrate`` copies runs between the two either way. Run ids
and lease owners are kept as their UTF-8 bytes (``bytea``): Postgres text cannot hold
NUL, which a run id may, and bytes sort as Python sorts the strings.

Migrations run in one transaction under ``pg_advisory_xact_lock`` on a key of the
schema, so stores starting at once on an empty schema do not race: the first creates
the tables, the others find them. A layout newer than this release is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from statekernel.errors import StoreError
from statekernel.stores.postgres._keys import lock_key

__all__ = [
    "CANCELS_VERSION",
    "COMMITTING",
    "QUEUES",
    "WATCHING",
    "SCHEMA",
    "STORE_VERSION",
    "TAGS_VERSION",
    "commits_channel",
    "layout_version",
    "migrate_schema",
]

WATCHING = "watching"
"""The kind of the advisory lock (``lock_key``) a store watching the schema's commits
holds shared, on its listening session, while it listens."""

COMMITTING = "committing"
"""The kind of the advisory lock a commit's notice trigger holds shared until the commit
ends: a store that starts watching takes it once, exclusive, to wait for the commits
that found no watcher."""

STORE_VERSION = 9
"""The layout version of the Postgres store written by this release (2: run queues and
commit notices; 3: commit notices a client can turn off; 4: lease rows that say how
their owner proves it is alive, and a run's largest fencing token kept with its row;
5: commit notices only while a store watches; 6: a run's cancel request kept with its
row; 7: queue entries taken no sooner than a time, ``ready_at``, and keyed ones, taken
while fewer than their ``key_limit`` of their ``key`` are; 8: runs' tags indexed in
``run_tags``; 9: queue entries and dead letters that carry the trace context of their
submit, ``traceparent`` and ``tracestate``)."""

CANCELS_VERSION = 6
"""The first layout that keeps cancel requests (``runs.cancel``): a store opened
read-only on an older one has none to read."""

TAGS_VERSION = 8
"""The first layout that indexes runs' tags (``run_tags``): a store opened read-only on
an older one finds no run with tags (a release before it wrote none)."""

SCHEMA = """
CREATE TABLE {s}.runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id bytea NOT NULL UNIQUE,
    revision bigint NOT NULL,
    state text NOT NULL,
    updated_us bigint NOT NULL,
    head bytea NOT NULL
);
CREATE INDEX runs_by_update ON {s}.runs (updated_us, run_id);
CREATE INDEX runs_by_state ON {s}.runs (state, updated_us, run_id);
CREATE TABLE {s}.commits (
    rid bigint NOT NULL, revision bigint NOT NULL, entry bytea NOT NULL,
    PRIMARY KEY (rid, revision)
);
CREATE TABLE {s}.messages (
    rid bigint NOT NULL, pos bigint NOT NULL, doc bytea NOT NULL, PRIMARY KEY (rid, pos)
);
CREATE TABLE {s}.turns (
    rid bigint NOT NULL, pos bigint NOT NULL, doc bytea NOT NULL, PRIMARY KEY (rid, pos)
);
CREATE TABLE {s}.blobs (
    rid bigint NOT NULL, key text NOT NULL, data bytea NOT NULL, PRIMARY KEY (rid, key)
);
CREATE TABLE {s}.leases (
    run_id bytea PRIMARY KEY, token bigint NOT NULL, owner bytea,
    expires double precision NOT NULL
)
"""

QUEUES = """
CREATE TABLE {s}.queue_entries (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    run_id bytea NOT NULL,
    submitted_ms bigint NOT NULL,
    consumer text,
    claimed_at timestamptz,
    deliveries integer NOT NULL DEFAULT 0
);
CREATE INDEX queue_entries_new ON {s}.queue_entries (queue, id) WHERE consumer IS NULL;
CREATE INDEX queue_entries_taken ON {s}.queue_entries (queue, claimed_at)
    WHERE consumer IS NOT NULL;
CREATE TABLE {s}.dead_letters (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    run_id bytea NOT NULL,
    entry text NOT NULL,
    reason text NOT NULL,
    detail text NOT NULL,
    worker text NOT NULL,
    at_ms bigint NOT NULL
);
CREATE INDEX dead_letters_by_queue ON {s}.dead_letters (queue, id)
"""
"""Run queues (layout version 2): entries not yet settled, and dead letters. An entry
is new while ``consumer`` is NULL; ``claimed_at`` is the server's time at which its
consumer last took or refreshed it."""

_NOTICE = """\
  PERFORM pg_notify('{channel}', NEW.revision || ' ' || NEW.state || ' ' || md5(NEW.run_id)
    || ' ' || CASE WHEN octet_length(NEW.run_id) <= 3000 THEN encode(NEW.run_id, 'hex')
    ELSE '' END);
  RETURN NULL;
END
$body$
"""
"""The end of the notice trigger's function in every layout: send the row's notice."""

_UNLESS_OFF = """\
  IF current_setting('statekernel.notify', true) = 'off' THEN
    RETURN NULL;
  END IF;
"""
"""Send nothing from a session whose setting ``statekernel.notify`` is ``off``."""

_FUNCTION = """
CREATE {replace}FUNCTION {{s}}.statekernel_notify() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
"""

NOTIFY = _FUNCTION.format(replace="") + _NOTICE
"""Commit notices (layout version 2): each insert or update of a run's row notifies the
schema's channel with the revision, the state, the MD5 of the run id and the run id in
hex (left out when longer than 3,000 bytes: a notice holds at most 8,000)."""

NOTIFY_TRIGGER = (
    "CREATE TRIGGER runs_notify AFTER INSERT OR UPDATE ON {s}.runs"
    " FOR EACH ROW EXECUTE FUNCTION {s}.statekernel_notify()"
)


def commits_channel(schema: str) -> str:
    """The ``NOTIFY`` channel of the commits of the store in ``schema``."""
    text = f"{schema}".encode("utf-8", "surrogatepass")
    return "statekernel_c_" + hashlib.blake2b(text, digest_size=12).hexdigest()


async def _version_2(conn: Any, schema: str) -> None:
    """Run queues, and commit notices."""
    for statement in _statements(QUEUES, schema):
        await conn.execute(statement)
    quoted = f'"{schema}"'
    await conn.execute(NOTIFY.format(s=quoted, channel=commits_channel(schema)))
    await conn.execute(NOTIFY_TRIGGER.format(s=quoted))


NOTIFY_UNLESS_OFF = _FUNCTION.format(replace="OR REPLACE ") + _UNLESS_OFF + _NOTICE
"""Commit notices (layout version 3): as in version 2, except from a session whose
setting ``statekernel.notify`` is ``off`` (a store opened with ``notify=0``)."""


async def _version_3(conn: Any, schema: str) -> None:
    """Commit notices that a session can turn off."""
    quoted = f'"{schema}"'
    await conn.execute(NOTIFY_UNLESS_OFF.format(s=quoted, channel=commits_channel(schema)))


LIVENESS = """
ALTER TABLE {s}.leases ADD COLUMN proof text NOT NULL DEFAULT 'renewal';
ALTER TABLE {s}.leases ADD COLUMN lock_key bigint;
ALTER TABLE {s}.leases ADD COLUMN suspect double precision;
ALTER TABLE {s}.runs ADD COLUMN fence bigint NOT NULL DEFAULT 0;
UPDATE {s}.runs r SET fence = l.token FROM {s}.leases l WHERE l.run_id = r.run_id;
DROP TRIGGER runs_notify ON {s}.runs;
CREATE TRIGGER runs_notify AFTER INSERT OR UPDATE OF revision ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.statekernel_notify()
"""
"""Liveness proofs and fences (layout version 4). A lease row says how its owner proves
it is alive: ``proof`` is ``lock`` (the session-level advisory lock ``lock_key`` is
held while the owner lives) or ``renewal`` (only by renewing the lease before it
expires: behind PgBouncer); ``suspect`` is the server's time at which a client first
found a ``lock`` owner's lock free (NULL: nobody did since the owner last renewed).
``runs.fence`` is the largest fencing token any commit of the run carried, so a lost or
deleted lease row never hands out a token again. Rows from before say ``renewal``:
their owners are proven alive by renewals alone until they renew. Only a new revision
notifies watchers (a fence moving with a commit does anyway)."""


async def _version_4(conn: Any, schema: str) -> None:
    """Lease rows that say how their owner proves it is alive; fences kept with runs."""
    for statement in _statements(LIVENESS, schema):
        await conn.execute(statement)


NOTIFY_WHEN_WATCHED = (
    _FUNCTION.format(replace="OR REPLACE ")
    + _UNLESS_OFF
    + """\
  PERFORM pg_advisory_xact_lock_shared({committing});
  IF pg_try_advisory_lock({watching}) THEN
    PERFORM pg_advisory_unlock({watching});
    RETURN NULL;
  END IF;
"""
    + _NOTICE
)
"""Commit notices (layout version 5): as in version 3, but only while a store watches
the schema's commits. A notifying transaction takes, at its commit, a lock that every
notifying transaction of the server waits for, fsync included: with notices on every
commit, the commits of all sessions were written one after another (8 sessions made 2.6x
fewer commits a second, ``bench/pg_notices.py``). A watching store holds the
``WATCHING`` advisory lock shared while it listens, so the trigger's exclusive attempt
fails (one that succeeds is let go at once: commits do not wait for each other there)
and it notifies.
Each commit holds ``COMMITTING`` shared until it ends; a store that starts watching
takes that lock exclusive once, after it holds ``WATCHING`` and listens, so every
commit that found no watcher has ended before the watch begins."""


async def _version_5(conn: Any, schema: str) -> None:
    """Commit notices only while a store watches."""
    quoted = f'"{schema}"'
    await conn.execute(
        NOTIFY_WHEN_WATCHED.format(
            s=quoted,
            channel=commits_channel(schema),
            committing=lock_key(COMMITTING, schema),
            watching=lock_key(WATCHING, schema),
        )
    )


CANCELS = "ALTER TABLE {s}.runs ADD COLUMN cancel bytea"
"""Cancel requests (layout version 6, ``CancelsRuns``): the run's request as kept
(``stores/_format/cancels``), NULL while none is. A column of the run's row, not a
table: a commit updates that row anyway, so checking and removing the request costs it
nothing more (no other row read or locked), a request and a commit of the run are
ordered by the row's lock, and a deleted run's request goes with its row. Adding a
nullable column without a default rewrites no row. Changing it alone notifies nobody
(the notice trigger fires on a new ``revision``)."""


async def _version_6(conn: Any, schema: str) -> None:
    """Cancel requests kept with the runs' rows."""
    await conn.execute(CANCELS.format(s=f'"{schema}"'))


QUEUE_KEYS = """
ALTER TABLE {s}.queue_entries ADD COLUMN ready_at timestamptz;
ALTER TABLE {s}.queue_entries ADD COLUMN key text;
ALTER TABLE {s}.queue_entries ADD COLUMN key_limit integer;
CREATE INDEX queue_entries_keys_taken ON {s}.queue_entries (queue, key)
    WHERE key IS NOT NULL AND consumer IS NOT NULL
"""
"""Delayed and keyed queue entries (layout version 7): ``ready_at`` (NULL: ready at
once), ``key`` and ``key_limit`` (at most that many entries of the key taken at once;
NULL: no key). Nullable columns without a default rewrite no row."""


async def _version_7(conn: Any, schema: str) -> None:
    """Delayed and keyed queue entries."""
    for statement in _statements(QUEUE_KEYS, schema):
        await conn.execute(statement)


TAGS = """
CREATE TABLE IF NOT EXISTS {s}.run_tags (
    rid bigint NOT NULL, key text NOT NULL, value text NOT NULL, PRIMARY KEY (rid, key)
);
CREATE INDEX IF NOT EXISTS run_tags_by_pair ON {s}.run_tags (key, value, rid)
"""
"""Runs' tags (layout version 8): a row per run and key, indexed by (key, value) so a
listing by tags reads the runs of each pair from the index. A commit that changes a
run's tags replaces its rows; runs of older layouts have none (no release before wrote
tags), so the upgrade fills nothing in."""


async def _version_8(conn: Any, schema: str) -> None:
    """Runs' tags indexed."""
    for statement in _statements(TAGS, schema):
        await conn.execute(statement)


QUEUE_TRACES = """
ALTER TABLE {s}.queue_entries ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE {s}.queue_entries ADD COLUMN IF NOT EXISTS tracestate text;
ALTER TABLE {s}.dead_letters ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE {s}.dead_letters ADD COLUMN IF NOT EXISTS tracestate text
"""
"""Queue entries' trace contexts (layout version 9): the W3C ``traceparent`` and
``tracestate`` of the span current where the entry was submitted (NULL: none), which
the worker's drive continues; a dead letter keeps its entry's, for the entry that puts
it back. Entries of older layouts have none. Nullable columns without a default rewrite
no row."""


async def _version_9(conn: Any, schema: str) -> None:
    """Queue entries that carry a trace context."""
    for statement in _statements(QUEUE_TRACES, schema):
        await conn.execute(statement)


_MIGRATIONS: dict[int, Callable[[Any, str], Awaitable[None]]] = {
    1: _version_2,
    2: _version_3,
    3: _version_4,
    4: _version_5,
    5: _version_6,
    6: _version_7,
    7: _version_8,
    8: _version_9,
}
"""What upgrades the store from a version to the next one."""


def _statements(script: str, schema: str) -> list[str]:
    quoted = f'"{schema}"'
    return [s.strip().format(s=quoted) for s in script.split(";") if s.strip()]


async def layout_version(conn: Any, schema: str) -> int | None:
    """The layout version stored in ``schema`` (None: no store there)."""
    table = await conn.fetchval("SELECT to_regclass($1)", f'"{schema}".statekernel_schema')
    if table is None:
        return None
    row = await conn.fetchval(f'SELECT max(version) FROM "{schema}".statekernel_schema')
    return None if row is None else int(row)


async def migrate_schema(conn: Any, schema: str) -> None:
    """Create the store's tables in ``schema``, or upgrade an older layout, in one
    transaction under the schema's advisory lock; ``StoreError`` for a newer layout."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key("schema", schema))
        version = await layout_version(conn, schema)
        if version is not None and version > STORE_VERSION:
            raise StoreError(
                f"Postgres store layout version {version} in schema {schema!r} is newer"
                f" than this release ({STORE_VERSION}); upgrade statekernel"
            )
        if version == STORE_VERSION:
            return
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".statekernel_schema (version integer NOT NULL)'
        )
        if version is None:
            for statement in _statements(SCHEMA, schema):
                await conn.execute(statement)
            for upgrade in _MIGRATIONS.values():
                await upgrade(conn, schema)
            await conn.execute(
                f'INSERT INTO "{schema}".statekernel_schema (version) VALUES ($1)', STORE_VERSION
            )
            return
        if version not in _MIGRATIONS:
            raise StoreError(
                f"Postgres store layout version {version} in schema {schema!r} was written"
                f" by an unreleased development version ({STORE_VERSION} here)"
            )
        while version < STORE_VERSION:
            await _MIGRATIONS[version](conn, schema)
            version += 1
            await conn.execute(f'UPDATE "{schema}".statekernel_schema SET version = $1', version)
