"""``RawRecords`` of ``postgresql://`` stores (``PostgresRecords``): the run's rows,
read and written through the store's own pool. asyncpg is imported only when used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from statekernel._storage.protocol import CheckpointStore
from statekernel.testing._raw import RecordKey, _Binary

if TYPE_CHECKING:
    from statekernel.stores.postgres import PostgresStore

__all__ = ["PostgresRecords"]


def _store(store: CheckpointStore) -> PostgresStore:
    from statekernel.stores.postgres import PostgresStore

    assert isinstance(store, PostgresStore), f"{store!r} is not a Postgres store"
    return store


async def _conn_do(store: CheckpointStore, sql: str, *args: Any) -> list[Any]:
    pg = _store(store)
    pool = await pg._open()
    async with pool.acquire() as conn:
        return list(await conn.fetch(sql, *args))


def _key(run_id: str) -> bytes:
    return run_id.encode("utf-8", "surrogatepass")


class PostgresRecords(_Binary):
    """``RawRecords`` of ``postgresql://`` stores; a write makes the store forget what it
    remembers of the run's head. Its columns are typed, so a damaged lease record is
    written as a token and an expiry no lease has (any bytes given for it make one)."""

    _TABLES: ClassVar[dict[str, tuple[str, str, str]]] = {
        "entry": ("commits", "revision", "entry"),
        "message": ("messages", "pos", "doc"),
        "turn": ("turns", "pos", "doc"),
        "blob": ("blobs", "key", "data"),
    }

    async def read(self, store: CheckpointStore, run_id: str) -> dict[RecordKey, bytes]:
        """The run's records.

        Returns:
            Every record of the run, by name (kind and revision, position or key), as
                stored.
        """
        s = f'"{_store(store).schema}"'
        rows = await _conn_do(
            store, f"SELECT id, head FROM {s}.runs WHERE run_id = $1", _key(run_id)
        )
        rid, head = rows[0]
        records: dict[RecordKey, bytes] = {("head", 0): head}
        for kind, (table, column, value) in self._TABLES.items():
            found = await _conn_do(
                store, f"SELECT {column}, {value} FROM {s}.{table} WHERE rid = $1", rid
            )
            records.update({(kind, name): data for name, data in found})
        return records

    async def write(
        self, store: CheckpointStore, run_id: str, key: RecordKey, data: bytes | None
    ) -> None:
        """Replace or remove one record."""
        pg = _store(store)
        s = f'"{pg.schema}"'
        kind, name = key
        pg.forget(run_id)
        if kind == "head":
            await _conn_do(
                store, f"UPDATE {s}.runs SET head = $1 WHERE run_id = $2", data, _key(run_id)
            )
            return
        rows = await _conn_do(store, f"SELECT id FROM {s}.runs WHERE run_id = $1", _key(run_id))
        rid = rows[0][0]
        table, column, value = self._TABLES[kind]
        if data is None:
            await _conn_do(
                store, f"DELETE FROM {s}.{table} WHERE rid = $1 AND {column} = $2", rid, name
            )
        else:
            await _conn_do(
                store,
                f"UPDATE {s}.{table} SET {value} = $1 WHERE rid = $2 AND {column} = $3",
                data,
                rid,
                name,
            )

    copies: tuple[str, ...] = ("run_id", "revision", "state", "lease")
    lease_kept: bool = True

    async def write_copy(
        self, store: CheckpointStore, run_id: str, name: str, value: bytes | None
    ) -> None:
        """Set a column of the run's ``runs`` row (``revision`` from the digits given),
        or damage its ``leases`` row (a removed lease: the row deleted)."""
        pg = _store(store)
        s = f'"{pg.schema}"'
        pg.forget(run_id)
        key = _key(run_id)
        if name == "lease" and value is None:
            await _conn_do(store, f"DELETE FROM {s}.leases WHERE run_id = $1", key)
        elif name == "lease":
            await _conn_do(
                store,
                f"UPDATE {s}.leases SET token = -1, expires = 'NaN' WHERE run_id = $1",
                key,
            )
        elif name == "run_id":
            assert value is not None
            await _conn_do(store, f"UPDATE {s}.runs SET run_id = $1 WHERE run_id = $2", value, key)
        elif name == "revision":
            assert value is not None
            await _conn_do(
                store, f"UPDATE {s}.runs SET revision = $1 WHERE run_id = $2", int(value), key
            )
        else:
            assert name == "state", f"a Postgres store keeps no copy {name!r}"
            assert value is not None
            text = value.decode("latin-1")
            await _conn_do(store, f"UPDATE {s}.runs SET state = $1 WHERE run_id = $2", text, key)
