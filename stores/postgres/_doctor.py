"""The doctor's probe of a Postgres store: read-only; layout, durability settings, leases.

Runs are read through a ``PostgresStore`` opened read-only (it creates no schema and
upgrades nothing). A lease's expiry is measured on the server's clock, and its owner
is alive while some session holds the owner's advisory lock (tested in ``pg_locks``,
never taken).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from statekernel._secrets import redact, redact_url, remember_url
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import StoreError
from statekernel.stores._doctor_probe import DAMAGED, OK, WARNING, Finding, LeaseView, RunRef
from statekernel.stores.postgres._connections import DRIVER_ERRORS, clean, discard
from statekernel.stores.postgres._keys import lock_parts
from statekernel.stores.postgres._ops import lease_record
from statekernel.stores.postgres._schema import STORE_VERSION, layout_version
from statekernel.stores.postgres._store import PostgresStore
from statekernel.stores.postgres._url import parse_postgres_url

__all__ = ["PostgresProbe"]


class PostgresProbe:
    """``postgresql://``: the schema's tables, read on a connection of the probe's own."""

    local_errors = False

    def __init__(self, url: str) -> None:
        remember_url(url)
        self.target = parse_postgres_url(url)
        self.subject = f"{redact_url(url)} (schema {self.target.schema})"
        self.store: CheckpointStore | None = PostgresStore(url, read_only=True)
        self._conn: Any = None
        self._t = f'"{self.target.schema}"'

    def _error(self, exc: BaseException) -> StoreError:
        return StoreError(
            f"Postgres store {self.subject!r}: {redact(f'{type(exc).__name__}: {exc}')}"
        )

    async def _query(self, sql: str, *args: Any) -> list[Any]:
        try:
            if self._conn is None:
                self._conn = await asyncpg.connect(
                    self.target.dsn, statement_cache_size=0 if self.target.pgbouncer else 100
                )
            return list(await self._conn.fetch(sql, *args))
        except (*DRIVER_ERRORS, ValueError) as exc:
            self._in_doubt(exc)
            raise self._error(exc) from exc  # ValueError: a DSN asyncpg cannot read

    def _in_doubt(self, exc: BaseException) -> None:
        """Drop the connection after an error that leaves its state in doubt (the next
        query opens a new one)."""
        if self._conn is not None and not clean(exc):
            conn, self._conn = self._conn, None
            discard(conn)

    async def settings(self) -> list[Finding]:
        """The layout version, ``synchronous_commit`` and ``fsync``; a schema without a
        store is a ``StoreError`` (nothing is created to check it)."""
        await self._query("SELECT 1")
        try:
            version = await layout_version(self._conn, self.target.schema)
        except DRIVER_ERRORS as exc:
            self._in_doubt(exc)
            raise self._error(exc) from exc
        if version is None:
            raise StoreError(f"no Postgres store in {self.subject!r}: the schema holds no store")
        if version < 1:
            raise StoreError(
                f"Postgres store {self.subject!r} has layout version {version}, which no"
                " release wrote"
            )
        if version > STORE_VERSION:
            raise StoreError(
                f"Postgres store {self.subject!r} has layout version {version}, newer than"
                f" this release ({STORE_VERSION}): upgrade statekernel to check it"
            )
        found = [Finding("store layout", self.subject, OK, f"layout version {version}")]
        if version != STORE_VERSION:
            detail = (
                f"layout version {version}: read as it is; the first writer of this release"
                f" upgrades it to {STORE_VERSION}, which older releases then refuse"
            )
            found = [Finding("store layout", self.subject, WARNING, detail)]
        sync = str((await self._query("SHOW synchronous_commit"))[0][0])
        if sync == "off":
            detail = (
                "off: a commit returns before its WAL is flushed; a server crash can lose"
                " the last commits that returned (set synchronous_commit = on)"
            )
            found.append(Finding("synchronous_commit", self.subject, WARNING, detail))
        else:
            detail = f"{sync}: each commit is durable on the server before it returns"
            found.append(Finding("synchronous_commit", self.subject, OK, detail))
        fsync = str((await self._query("SHOW fsync"))[0][0])
        if fsync == "on":
            found.append(Finding("fsync", self.subject, OK, "on"))
        else:
            detail = (
                f"{fsync}: the server never forces its writes to disk; an OS crash or power"
                " loss can damage the whole database (set fsync = on)"
            )
            found.append(Finding("fsync", self.subject, WARNING, detail))
        return found

    async def runs(self) -> list[RunRef]:
        """The ``run_id`` column of the ``runs`` table."""
        rows = await self._query(f"SELECT run_id FROM {self._t}.runs ORDER BY run_id")
        refs: list[RunRef] = []
        for (raw,) in rows:
            try:
                run_id = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                subject = repr(bytes(raw))
                detail = "its run_id column is not UTF-8"
                refs.append(RunRef(None, subject, Finding("records", subject, DAMAGED, detail)))
                continue
            refs.append(RunRef(run_id, run_id))
        return refs

    async def lease(self, run_id: str) -> LeaseView | None:
        """The run's row of the ``leases`` table, on the server's clock; whether its owner
        is alive as the row's own proof says (its advisory lock held; a row proven by
        renewals, or written before rows said how, tells nothing but its expiry)."""
        rows = await self._query(
            f"SELECT token, owner, expires, extract(epoch FROM clock_timestamp())::float8,"
            f" to_jsonb(l) ->> 'proof', (to_jsonb(l) ->> 'lock_key')::bigint"
            f" FROM {self._t}.leases l WHERE run_id = $1",
            run_id.encode("utf-8", "surrogatepass"),
        )
        if not rows:
            return None
        record = lease_record(rows[0][:3], run_id, f"Postgres store {self.subject!r}")
        if record.owner is None:
            return LeaseView(str(record.token), None)
        alive: bool | None = None
        proof, key = rows[0][4], rows[0][5]
        if proof == "lock" and key is not None:
            classid, objid = lock_parts(key)
            held = await self._query(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1)",
                classid,
                objid,
            )
            alive = bool(held[0][0])
        return LeaseView(str(record.token), record.owner, record.expires - rows[0][3], alive)

    async def cross_checks(self) -> list[Finding]:
        """None."""
        return []

    async def aclose(self) -> None:
        """Close the connection and the store."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        if self.store is not None:
            await self.store.aclose()
