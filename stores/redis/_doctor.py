"""The doctor's probe of a Redis store: persistence, eviction and the run index."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from statekernel._secrets import redact, redact_url
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import (
    CorruptCheckpoint,
    StoreError,
)
from statekernel.stores._doctor_probe import (
    DAMAGED,
    OK,
    SHOWN,
    WARNING,
    Finding,
    LeaseView,
    RunRef,
)
from statekernel.stores._host.lease_records import redis_holder
from statekernel.stores.redis._store import RedisStore, _load_head
from statekernel.stores.redis._wire import FAILURES

__all__ = ["RedisProbe"]

# -- Redis -------------------------------------------------------------------------

_GLOB = str.maketrans({c: "\\" + c for c in "*?[]\\"})

_ALWAYS = (
    "'committed before the side effect' holds on Redis only with AOF on and appendfsync always"
)


class RedisProbe:
    """``redis://``: keys under the store's prefix, and the server's configuration."""

    local_errors = False

    def __init__(self, url: str) -> None:
        self._store = RedisStore(url)
        self.store: CheckpointStore | None = self._store
        self.subject = redact_url(url)
        self._client: Any = self._store.client
        self._heads: set[str] = set()

    async def _nodes(self) -> list[Any]:
        """The nodes whose settings and keys are checked: each primary of a Redis
        Cluster, else None (the one server)."""
        if not isinstance(self._client, RedisCluster):
            return [None]
        await self._call("PING")  # the client learns the cluster's nodes
        return list(self._client.get_primaries())

    async def _call(self, command: str, *args: Any, node: Any = None) -> Any:
        options = {} if node is None else {"target_nodes": node}
        try:
            return await self._client.execute_command(command, *args, **options)
        except FAILURES as exc:
            if isinstance(exc, ResponseError):
                raise
            detail = redact(f"{type(exc).__name__}: {exc}")
            raise StoreError(f"Redis store {self.subject!r}: {detail}") from exc

    async def settings(self) -> list[Finding]:
        """Persistence (AOF, appendfsync, snapshots) and eviction (of each primary of
        a Redis Cluster)."""
        await self._call("PING")
        found: list[Finding] = []
        for node in await self._nodes():
            subject = self.subject if node is None else f"{self.subject} node {node.name}"
            try:
                config = await self._config(
                    "appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy", node=node
                )
            except ResponseError as exc:
                found.append(await self._from_info(str(exc), node, subject))
                continue
            found += [_persistence(config, subject), _eviction(config, subject)]
        return found

    async def _config(self, *names: str, node: Any = None) -> dict[str, str]:
        found: dict[str, str] = {}
        for name in names:
            reply = await self._call("CONFIG", "GET", name, node=node)
            if not isinstance(reply, dict):  # a client that leaves the reply a flat list
                reply = dict(zip(reply[::2], reply[1::2], strict=True))
            for key, value in reply.items():
                found[_text(key)] = _text(value)
        return found

    async def _from_info(self, refused: str, node: Any, subject: str) -> Finding:
        why = f"CONFIG GET refused ({refused})"
        try:
            options = {} if node is None else {"target_nodes": node}
            info = await self._client.info("persistence", **options)
        except ResponseError as exc:
            detail = f"persistence unknown: {why}, INFO refused ({exc}); {_ALWAYS}"
            return Finding("persistence", subject, WARNING, detail)
        except FAILURES as exc:
            raise StoreError(f"Redis store {self.subject!r}: {exc}") from exc
        if str(info.get("aof_enabled", "0")) != "1":
            detail = f"AOF off (INFO persistence: aof_enabled:0; {why}): {_not_durable()}"
            return Finding("persistence", subject, WARNING, detail)
        detail = f"AOF on, appendfsync unknown ({why}): {_ALWAYS}"
        return Finding("persistence", subject, WARNING, detail)

    async def runs(self) -> list[RunRef]:
        """Every run head key under the prefix, named by its head (or by its key's hash
        tag when the head cannot be read); the run index is compared with them."""
        prefix = self._store.prefix
        pattern = prefix.translate(_GLOB) + ":{*}:head"
        keys: list[bytes] = []
        for node in await self._nodes():
            cursor: Any = 0
            while True:
                reply = await self._call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000, node=node)
                cursor, batch = reply
                if isinstance(cursor, dict):  # a cluster's: the cursor by node name
                    cursor = next(iter(cursor.values()))
                keys += batch
                if int(cursor) == 0:
                    break
        found: list[RunRef] = []
        for key in sorted(set(keys)):
            found.append(await self._run(_text(key), len(prefix)))
        self._heads = {r.run_id for r in found if r.run_id is not None}
        return found

    async def _run(self, key: str, cut: int) -> RunRef:
        tag = key[cut + 2 : -len("}:head")]
        named = None if tag.startswith("~") else tag
        doc = await self._call("HGET", key, "doc")
        try:
            if doc is None:
                raise CorruptCheckpoint(f"invalid head {key!r}: no document")
            head = _load_head(doc, f"run head {key!r}")
        except CorruptCheckpoint as exc:
            if named is not None:
                return RunRef(named, named)  # the run's own checks report the damage
            return RunRef(None, key, Finding("records", key, DAMAGED, str(exc)))
        run_id = head.get("run_id") if isinstance(head, dict) else None
        if not isinstance(run_id, str) or self._store.run_key(run_id, "head") != key:
            detail = f"the head names run {run_id!r}, whose keys are elsewhere"
            return RunRef(None, key, Finding("records", key, DAMAGED, detail))
        return RunRef(run_id, run_id)

    async def cross_checks(self) -> list[Finding]:
        """The run index against the heads found by ``runs``."""
        return [await self._index()]

    async def _index(self) -> Finding:
        heads = self._heads
        index = self._store.prefix + ":runs"
        listed = {_text(m) for m in await self._call("ZRANGE", index, 0, -1)}
        pending = {_text(m) for m in await self._call("ZRANGE", index + ":pending", 0, -1)}
        missing = sorted(heads - listed)
        stale = sorted(listed - heads)
        if not missing and not stale:
            return Finding("run index", index, OK, f"{len(listed)} runs listed, as stored")
        parts = []
        if missing:
            note = " (announced: the next listing adds them)" if set(missing) <= pending else ""
            parts.append(f"not listed: {', '.join(missing[:SHOWN])}{note}")
        if stale:
            parts.append(f"listed without a stored run: {', '.join(stale[:SHOWN])}")
        return Finding("run index", index, WARNING, "; ".join(parts))

    async def lease(self, run_id: str) -> LeaseView | None:
        """The run's lease key (``token/owner``) and its time to live; the fence counter
        when no lease is held."""
        key = self._store.run_key(run_id, "lease")
        value = await self._call("GET", key)
        if value is None:
            fence = await self._call("GET", self._store.run_key(run_id, "fence"))
            return None if fence is None else LeaseView(_text(fence), None)
        text, owner = redis_holder(value, run_id, f"Redis store {self.subject!r}")
        token = text.partition("/")[0]
        ttl = int(await self._call("PTTL", key))
        if ttl == -2:  # expired between the two reads
            return LeaseView(token, None)
        return LeaseView(token, owner or None, ttl / 1000 if ttl >= 0 else None, None)

    async def aclose(self) -> None:
        """Close the client."""
        await self._store.aclose()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _not_durable() -> str:
    return (
        "not durable: commits acknowledged since the last snapshot are lost when Redis"
        f" restarts, though their side effects may have run; {_ALWAYS}"
    )


def _persistence(config: dict[str, str], subject: str) -> Finding:
    aof = config.get("appendonly", "?")
    fsync = config.get("appendfsync", "?")
    save = config.get("save", "")
    snapshots = f"RDB save {save!r}" if save else "no RDB snapshots"
    if aof != "yes":
        detail = f"AOF off (appendonly {aof}, appendfsync {fsync}; {snapshots}): {_not_durable()}"
        return Finding("persistence", subject, WARNING, detail)
    if fsync == "always":
        detail = "appendonly yes, appendfsync always: each commit is on disk before it returns"
        return Finding("persistence", subject, OK, detail)
    lost = "about a second" if fsync == "everysec" else "what the OS had not yet written"
    detail = (
        f"appendonly yes, appendfsync {fsync}: not durable against a crash of the Redis"
        f" host: up to {lost} of acknowledged commits can be lost; {_ALWAYS}"
    )
    return Finding("persistence", subject, WARNING, detail)


def _eviction(config: dict[str, str], subject: str) -> Finding:
    limit = config.get("maxmemory", "0")
    policy = config.get("maxmemory-policy", "?")
    if limit == "0" or policy == "noeviction":
        detail = f"maxmemory {limit}, maxmemory-policy {policy}: no key is ever evicted"
        return Finding("eviction", subject, OK, detail)
    kept = "leases and fence counters" if policy.startswith("volatile") else "runs and leases"
    detail = (
        f"maxmemory {limit}, maxmemory-policy {policy}: Redis may evict {kept} when full;"
        " use maxmemory-policy noeviction"
    )
    return Finding("eviction", subject, WARNING, detail)
