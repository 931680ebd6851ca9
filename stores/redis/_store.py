"""``redis://host:port/db`` (and ``rediss://``): runs in Redis, one Lua script per commit.

Keys of a run share the hash tag ``{run}`` (Cluster-ready): ``<prefix>:{run}:head``
(hash: revision and head document), ``:c`` (list: commit log entry per revision),
``:m`` and ``:t`` (lists: message and turn logs), ``:b`` (hash: blobs), ``:cancel``
(a kept cancel request, ``_cancels``). The commit script checks the head and the log
lengths, then writes the head and appends the parts and the commit log entry, all or
nothing. The run index ``<prefix>:runs`` (a sorted set by update time) is kept right
across clients killed mid-commit as ``_index`` describes. Options in the query:
``prefix=...`` (default ``statekernel``); ``cluster=1`` for a Redis Cluster;
``replicas=N`` and ``replica_timeout=ms`` (below); AUTH and TLS as in ``redis-py``.

Commits that are ready at the same moment (of different runs) share one round trip:
each is its own ``EVALSHA`` in one pipeline, its reply read on its own, so one
script's error or refusal is that commit's outcome alone (``_group``).

A commit under a lease (``commit(checkpoint, lease=...)``) is fenced: the script also
checks that the run's lease key ``<prefix>:{run}:lease`` holds the lease's token, and
refuses the commit with ``LeaseLost`` otherwise. A lease expires on the server's clock
(``PX``), which no client's clock step can move.

Replicas (``_replicas``): a commit, and the taking or renewal of a lease, is
acknowledged only once ``replicas=N`` replicas have it (``WAIT`` after its script, on
the same connection; ``replica_timeout=ms``, default 1000, bounds the wait). By
default N is 1 where the key's Redis Cluster shard has a replica, else 0; on one
server 0. A failover then never rolls back an acknowledged commit, and a fencing token
handed out is on a replica, so the tokens of a run only grow across it. A commit that
fewer replicas confirm in time is a ``StoreError`` (its outcome is unknown: the kernel
settles it by loading the run, and this store's load confirms the commit first), a
lease taken so is given back and a ``StoreError``, a renewal so a ``StoreError``.
``replicas=0`` acknowledges on the primary's word alone (a failover may lose the last
commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from datetime import datetime
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs
import redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from statekernel._records.events import Event
from statekernel._records.run import Cancellation, Run, StateId
from statekernel._records.tags import check_tag_filter
from statekernel._secrets import logger, redact, redact_url, remember_url
from statekernel._storage.closing import Closing
from statekernel._storage.protocol import Checkpoint, DamagedRun, Lease, RunPage, RunSummary
from statekernel._storage.watching import CommitNotice, Feed, fed_by
from statekernel.errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    LeaseLost,
    RunBusy,
    RunNotFound,
    StoreError,
)
from statekernel.stores._common import (
    MAX_REVISION,
    HeadCache,
    Prior,
    check_head,
    check_revision,
    checked_events,
    checked_listing,
    checked_revision,
    checked_run_id,
    created_run,
    micros,
)
from statekernel.stores._format.cancels import cancel_requested
from statekernel.stores._format.checksum import seal, unseal, unseal_blobs, unseal_each
from statekernel.stores._format.codec import (
    EncodedCommit,
    check_log,
    check_run_id,
    decode_events,
    decode_run,
    encode_commit,
    head_summary,
    iter_history,
    log_ends,
    replay,
    snapshot_of,
)
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.documents import dump_bytes, load_json
from statekernel.stores._group import GroupCommit
from statekernel.stores._host.lease_records import damaged_lease, redis_holder
from statekernel.stores._listing import decode_cursor, encode_cursor
from statekernel.stores.redis._cancels import CANCEL_KEY, CancelRequests
from statekernel.stores.redis._clients import (
    CLUSTER_NEEDS,
    check_cluster_support,
    client_for,
    cluster_for,
)
from statekernel.stores.redis._fencing import RELEASE, RENEW, AnyRedis
from statekernel.stores.redis._index import Pairs, RunIndex
from statekernel.stores.redis._queue import RedisRunQueue
from statekernel.stores.redis._queue_admin import queue_names
from statekernel.stores.redis._replicas import OPTION_NAMES, ReplicaOptions, Replication, options_of
from statekernel.stores.redis._scripts import (
    ACQUIRE_SCRIPT,
    COMMIT_SCRIPT,
    CREATE_LEASED_SCRIPT,
    KEEP_FENCE_SCRIPT,
    CommitScript,
    Outcome,
    Unconfirmed,
    read_acquired,
    read_reply,
)
from statekernel.stores.redis._tagged import head_pairs, new_pairs, page_of_tagged
from statekernel.stores.redis._wire import FAILURES, Command, Wire, initialized, transaction

__all__ = ["CLUSTER_NEEDS", "RedisStore", "check_cluster_support"]

T = TypeVar("T")
log = logger("statekernel.stores")
_PLAIN_TAG = re.compile(r"[^{}]{1,200}")


@attrs.frozen
class _Known:
    """A head as stored: its revision and document bytes (the commit script checks both)."""

    revision: int
    doc: bytes


_FLAGS = {"1": True, "yes": True, "true": True, "0": False, "no": False, "false": False}


_OWN = ("prefix", "cluster", *OPTION_NAMES)
"""The query options the store reads itself (the others go to ``redis-py``)."""


def _split_url(url: str) -> tuple[str, str, bool, ReplicaOptions]:
    """The URL for ``redis-py`` and the store's own options: the key prefix, whether
    the server is a Redis Cluster (``cluster=1``) and what writes wait for
    (``replicas``, ``replica_timeout``)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((v for k, v in query if k == "prefix"), "statekernel")
    flag = next((v for k, v in query if k == "cluster"), "0")
    if flag.lower() not in _FLAGS:
        raise ValueError(f"cluster={flag!r}: expected 1 or 0 (or yes/no, true/false)")
    replicas = options_of(query)
    rest = urlencode([(k, v) for k, v in query if k not in _OWN])
    return urlunsplit(parts._replace(query=rest)), prefix, _FLAGS[flag.lower()], replicas


def _notice(message: Any) -> CommitNotice | None:
    """The commit notice of a pub/sub message (``revision state run-id``)."""
    if not isinstance(message, dict) or message.get("type") != "message":
        return None
    data = message.get("data")
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else str(data)
    revision, _, rest = text.partition(" ")
    state, _, run_id = rest.partition(" ")
    if not revision.isdigit() or not run_id:
        return None
    return CommitNotice(run_id, int(revision), state)


class RedisStore(Closing):
    """Runs in Redis: one server, or a Redis Cluster (``cluster=1``), whose writes wait
    for the replicas asked for (``replicas=N``)."""

    def __init__(self, url: str, *, client: AnyRedis | None = None) -> None:
        self.url = url
        remember_url(url)
        try:
            target, self.prefix, cluster, replicas = _split_url(url)
            self._client = client or (cluster_for(target) if cluster else client_for(target))
        except (ValueError, TypeError, *FAILURES) as exc:
            raise ConfigError(f"bad Redis URL {redact_url(url)!r}: {self._clean(exc)}") from exc
        if isinstance(self._client, RedisCluster):
            check_cluster_support(redis.__version__)
        self._script = self._client.register_script(COMMIT_SCRIPT)
        self._create = self._client.register_script(CREATE_LEASED_SCRIPT)
        self._acquire = self._client.register_script(ACQUIRE_SCRIPT)
        self._keep_fence = self._client.register_script(KEEP_FENCE_SCRIPT)
        self._renew = self._client.register_script(RENEW)
        self._release = self._client.register_script(RELEASE)
        self._known: HeadCache[_Known] = HeadCache()
        self._commits_channel = f"{self.prefix}:commits"
        self._wire = Wire(self._client)
        where = redact_url(url)
        self._replication = Replication(self._client, self._wire, replicas, where)
        self._runs = RunIndex(self._client, self.prefix, self._call, self._wire)
        self._cancels = CancelRequests(self._client, self._replication, self._call, where)
        self._group: GroupCommit[CommitScript, Outcome] = GroupCommit(self._scripts, self._failed)

    def __repr__(self) -> str:
        return f"RedisStore({redact_url(self.url)!r})"

    def _clean(self, exc: BaseException) -> str:
        return redact(f"{type(exc).__name__}: {exc}")

    def _error(self, exc: BaseException) -> StoreError:
        error = StoreError(f"Redis store {redact_url(self.url)!r}: {self._clean(exc)}")
        error.__cause__ = exc
        return error

    def _fail(self, exc: BaseException) -> NoReturn:
        raise self._error(exc) from exc

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except FAILURES as exc:
            self._fail(exc)

    def _base(self, run_id: str) -> str:
        tag = run_id if _PLAIN_TAG.fullmatch(run_id) else "~" + _digest(run_id)
        return f"{self.prefix}:{{{tag}}}:"

    def _keys(self, run_id: str) -> list[str]:
        base = self._base(run_id)
        return [base + "head", base + "c", base + "m", base + "t", base + "b"]

    def run_key(self, run_id: str, name: str) -> str:
        """A key called ``name`` in the hash slot of the run's keys (for leases)."""
        return self._base(run_id) + name

    @contextlib.asynccontextmanager
    async def watch(self, run_id: str | None = None) -> AsyncIterator[Feed]:
        """Notices of the commits of ``run_id`` (or of every run) made once entered,
        published by the commit script on ``<prefix>:commits`` (subscribed again after a
        lost connection: notices of the gap are missed)."""
        if run_id is not None:
            checked_run_id(run_id)
        feed = Feed(run_id)
        await self._call(initialized(self._client))
        pubsub: Any = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await self._call(pubsub.subscribe(self._commits_channel))
        except BaseException:
            with contextlib.suppress(*FAILURES):
                await pubsub.aclose()
            raise
        async with fed_by(feed, self._receive(pubsub, feed)):
            yield feed

    async def _receive(self, pubsub: Any, feed: Feed) -> None:
        """Put the notices of ``pubsub`` on ``feed``, subscribing again after an error
        (until the server answers)."""
        try:
            while True:
                try:
                    message = await pubsub.get_message(timeout=None)
                except FAILURES as exc:
                    log.warning("watching %r: %s; subscribing again", self, self._clean(exc))
                    with contextlib.suppress(*FAILURES):
                        await pubsub.aclose()
                    pubsub = None
                    pubsub = await self._subscribe_again()
                    continue
                notice = _notice(message)
                if notice is not None:
                    feed.put(notice)
        finally:
            if pubsub is not None:
                with contextlib.suppress(*FAILURES):
                    await pubsub.aclose()

    async def _subscribe_again(self) -> Any:
        """A new subscription to the commits channel, tried again (after 0.1 s, then
        longer and longer, up to 5 s) until the server takes it."""
        delay = 0.1
        while True:
            await asyncio.sleep(delay)
            pubsub: Any = None
            try:
                await initialized(self._client)
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self._commits_channel)
                return pubsub
            except FAILURES as exc:
                log.warning("watching %r: %s; subscribing again", self, self._clean(exc))
                if pubsub is not None:
                    with contextlib.suppress(*FAILURES):
                        await pubsub.aclose()
                delay = min(delay * 2, 5.0)

    @property
    def client(self) -> AnyRedis:
        """The redis.asyncio client, a ``RedisCluster`` on a cluster (run queues and
        leases live on the same server)."""
        return self._client

    @property
    def _index(self) -> str:
        return f"{self.prefix}:runs"

    async def submit(self, run_id: str, queue: str = "default", **how: Any) -> str:
        """Enqueue the existing run on the run queue ``queue`` for workers (``how``: its
        ``delay_ms``, ``key``, ``key_limit`` and ``trace``: ``RedisRunQueue.submit``)."""
        run_queue = RedisRunQueue(self, queue)
        await self.load(run_id)  # RunNotFound for a run that does not exist
        return await run_queue.submit(run_id, **how)

    async def queue_names(self) -> list[str]:
        """The names of the run queues with entries or dead letters, sorted."""
        return await self._call(queue_names(self._client, self.prefix))

    def run_queue(self, name: str) -> RedisRunQueue:
        """The run queue ``name`` (a Redis Stream next to the runs)."""
        return RedisRunQueue(self, name)

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision`` (one transaction); first, a commit of
        the run this store doubts is confirmed on its replicas (``StoreError`` while it
        cannot be)."""
        checked_revision(run_id, revision)
        head_key, c_key, m_key, t_key, b_key = self._keys(run_id)
        await self._call(self._replication.confirm(run_id))
        what = f"run {run_id!r} in {redact_url(self.url)}"
        pipe = await self._call(transaction(self._client))
        pipe.hmget(head_key, ["doc", "r"])
        pipe.lrange(m_key, 0, -1)
        pipe.lrange(t_key, 0, -1)
        pipe.hgetall(b_key)
        revision = checked_revision(run_id, revision)
        if revision is not None and 0 <= revision <= MAX_REVISION:
            pipe.lrange(c_key, snapshot_of(revision), revision)
        (doc, r), messages, turns, blobs, *history = await self._call(pipe.execute())
        if doc is None:
            raise RunNotFound(run_id)
        head = _load_head(doc, what)
        check_run_id(head, run_id, what)
        wanted = check_revision(run_id, revision, _checked_r(r, head, what))
        if wanted != head["revision"]:
            head = replay(_entries(history[0], snapshot_of(wanted), what), wanted, what=what)
        m_end, t_end = log_ends(head)
        msg_docs = unseal_each(messages[:m_end], f"message of {what}")  # parsed as decoded
        turn_docs = unseal_each(turns[:t_end], f"completed turn of {what}")
        blob_map = unseal_blobs({k.decode(): v for k, v in blobs.items()}, what)
        return decode_run(head, msg_docs, turn_docs, blob_map, what=what)

    async def history(self, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
        """Every revision with the events of its commit, oldest first (for copying runs)."""
        head_key, c_key, m_key, t_key, b_key = self._keys(run_id)
        what = f"history of {run_id!r} in {redact_url(self.url)}"
        pipe = await self._call(transaction(self._client))
        pipe.hmget(head_key, ["doc", "r"])
        pipe.lrange(c_key, 0, -1)
        pipe.lrange(m_key, 0, -1)
        pipe.lrange(t_key, 0, -1)
        pipe.hgetall(b_key)
        (doc, r), entries, messages, turns, blobs = await self._call(pipe.execute())
        if doc is None:
            raise RunNotFound(run_id)
        head = _load_head(doc, what)
        check_run_id(head, run_id, what)
        m_end, t_end = log_ends(head)
        last = _checked_r(r, head, what)
        parsed = _entries(entries, 0, what)
        msg_docs = _parse_list(unseal_each(messages[:m_end], f"message of {what}"), what)
        turn_docs = _parse_list(unseal_each(turns[:t_end], f"completed turn of {what}"), what)
        blob_map = unseal_blobs({k.decode(): v for k, v in blobs.items()}, what)
        history = iter_history(parsed, msg_docs, turn_docs, blob_map, run_id, last=last, what=what)
        for item in history:
            yield item

    async def _prior(self, run_id: str, head_key: str) -> Prior[_Known] | None:
        doc, r = await self._call(self._client.hmget(head_key, ["doc", "r"]))
        if doc is None:
            return None
        what = f"run {run_id!r} in {redact_url(self.url)}"
        head = _load_head(doc, what)
        check_run_id(head, run_id, what)
        return Prior(_Known(_checked_r(r, head, what), _bytes(doc)), head)

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease (a key that expires ``ttl`` seconds after its last renewal;
        a dead owner's lease is taken over once it expired)."""
        return await self._take(run_id, owner, ttl, uuid.uuid4().hex)

    async def _take(self, run_id: str, owner: str, ttl: float, nonce: str) -> Lease:
        """``acquire`` as the call ``nonce``: the same call sent again is given the lease
        it took (``ACQUIRE_SCRIPT``)."""
        keys = [self.run_key(run_id, "lease"), self.run_key(run_id, "fence"), self._keys(run_id)[0]]
        keys += [self.run_key(run_id, "taker"), self.run_key(run_id, "last")]
        args: list[Any] = [owner, _ms(ttl), nonce]
        reply, short = await self._call(self._replication.script(self._acquire, keys, args))
        got = read_acquired(reply, owner, run_id, f"Redis store {redact_url(self.url)!r}")
        if got.status == 2:
            raise RunNotFound(run_id)
        if got.status == 0:
            raise RunBusy(run_id, got.holder or got.token)
        lease = Lease(run_id, owner, got.token, taken_from=got.taken_from)
        if short is not None:  # a token no replica may have: never handed out
            with contextlib.suppress(StoreError):
                await self.release(lease)
            raise self._replication.error(f"the lease of run {run_id!r} (given back)", short)
        return lease

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Extend the lease."""
        key = self.run_key(lease.run_id, "lease")
        args: list[Any] = [lease.token, _ms(ttl)]
        renewed, short = await self._call(self._replication.script(self._renew, [key], args))
        if not renewed:
            raise LeaseLost(lease.run_id, -1, lease.token)
        if short is not None:
            raise self._replication.error(
                f"the renewal of the lease of run {lease.run_id!r}", short
            )

    async def release(self, lease: Lease) -> None:
        """Give the lease up."""
        keys = [self.run_key(lease.run_id, name) for name in ("lease", "last")]
        await self._call(self._release(keys=keys, args=[lease.token]))

    async def fence(self, run_id: str) -> int:
        """The largest fencing token given for the run (``KeepsFences``)."""
        checked_run_id(run_id)
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(self._keys(run_id)[0])
        pipe.get(self.run_key(run_id, "fence"))
        exists, given = await self._call(pipe.execute())
        if not exists:
            raise RunNotFound(run_id)
        try:
            return int(given or 0)
        except ValueError:
            where = f"Redis store {redact_url(self.url)!r}"
            raise damaged_lease(run_id, where, f"its fence holds {given!r}") from None

    async def keep_fence(self, run_id: str, at_least: int) -> None:
        """Make every later token of the run larger than ``at_least`` (``KeepsFences``),
        once the replicas asked for have it."""
        checked_run_id(run_id)
        keys = [self.run_key(run_id, "fence"), self._keys(run_id)[0]]
        done, short = await self._call(
            self._replication.script(self._keep_fence, keys, [int(at_least)])
        )
        if done == -1:
            raise RunNotFound(run_id)
        if short is not None:
            raise self._replication.error(f"the fence of run {run_id!r}", short)

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        """Keep ``request`` unless a request is kept already (``CancelsRuns``), in a script
        that checks the head whose state allows it is still the run's (``_cancels``)."""
        checked_run_id(run_id)
        keys = [self._keys(run_id)[0], self.run_key(run_id, CANCEL_KEY)]
        known = self._known.get(run_id)
        seen = None if known is None else known.key.doc
        return await self._cancels.keep(run_id, keys, request, seen)

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        """The run's kept cancel request (``CancelsRuns``)."""
        checked_run_id(run_id)
        return await self._cancels.kept(run_id, self.run_key(run_id, CANCEL_KEY))

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Run the commit script, then move the run in the index.

        With ``lease``, the commit lands only while the run's lease key
        holds the lease's token (checked in the same script); otherwise it raises
        ``LeaseLost``. Each commit carries an id, kept in the head: a script sent again
        after a cut connection recognises its own commit if it had landed. A commit of
        the run that this store doubts (its replicas were not confirmed) is confirmed
        first: ``StoreError`` while it cannot be, as its outcome decides this one's.
        """
        run = checkpoint.run
        head_key = self._keys(run.run_id)[0]
        await self._call(self._replication.confirm(run.run_id))
        known = self._known.get(run.run_id) if run.revision > 0 else None
        if known is None or known.key.revision != checkpoint.expected_revision:
            known = await self._prior(run.run_id, head_key) if run.revision > 0 else None
        check_head(checkpoint, None if known is None else known.key.revision)
        fenced = () if lease is None else ((self.run_key(run.run_id, "lease"), lease.token),)
        script, enc = self._commit_script(checkpoint, known, self._script, fenced)
        status, actual, announced, _, asked = await self._group.submit(script)
        if status == 3 and lease is not None:
            self._known.drop(run.run_id)
            raise LeaseLost(run.run_id, checkpoint.expected_revision, lease.token)
        await self._check_landed(checkpoint, status, actual, asked)
        prior = None if known is None else known.head
        await self._landed(checkpoint, script, enc, announced, new_pairs(prior, enc.head))

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        """``commit`` of a new run that takes its lease in the same script
        (``CreatesLeased``): the lease ``acquire`` would give, with the next token of the
        run's fence counter; None when the id kept a lease key (the run is created
        without it). A creation its replicas were not confirmed for gives its lease back
        at once (a token no replica may have is never handed out) and raises
        ``StoreError``; the run itself stays doubted, as a commit's does. One whose reply
        was lost asks for the lease again as the same call (its nonce): a creation that
        landed gets the lease it took."""
        created_run(checkpoint)
        run = checkpoint.run
        await self._call(self._replication.confirm(run.run_id))
        nonce = uuid.uuid4().hex  # the creation's, as an acquire's: its lease known again
        keys = [self.run_key(run.run_id, key) for key in ("lease", "fence", "taker", "last")]
        lease_args: list[Any] = [owner, _ms(ttl), nonce, None]
        script, enc = self._commit_script(
            checkpoint, None, self._create, tuple(zip(keys, lease_args, strict=True))
        )
        try:
            status, actual, announced, token, _ = await self._group.submit(script)
        except Unconfirmed as short:
            with contextlib.suppress(StoreError):
                await self.release(Lease(run.run_id, owner, short.token))
            raise StoreError(str(short)) from None
        except StoreError as failed:  # the reply was lost: the lease it took, if it landed
            try:
                return await self._take(run.run_id, owner, ttl, nonce)
            except (RunNotFound, RunBusy, StoreError):
                raise failed from None
        await self._check_landed(checkpoint, status, actual)
        lease = None
        if token:
            taken, holder = redis_holder(token, run.run_id, f"Redis store {redact_url(self.url)!r}")
            lease = Lease(run.run_id, owner, taken) if holder == owner else None
        try:
            await self._landed(checkpoint, script, enc, announced, new_pairs(None, enc.head))
        except BaseException:
            if lease is not None:  # the run is there; its lease is not kept from the caller
                with contextlib.suppress(StoreError):
                    await self.release(lease)
            raise
        return lease

    def _commit_script(
        self,
        checkpoint: Checkpoint,
        known: Prior[_Known] | None,
        lua: Any,
        extra: tuple[tuple[str, Any], ...] = (),
    ) -> tuple[CommitScript, EncodedCommit]:
        """The script of a commit on top of ``known`` (None: a new run), and its encoding;
        ``extra``: (key, argument) pairs the script reads after the commit's own (the
        lease that fences it; the lease a creation takes), an argument None: none."""
        run = checkpoint.run
        enc = encode_commit(checkpoint, None if known is None else known.head)
        cid = uuid.uuid4().hex  # this commit's id: a script sent again knows it landed
        args: list[Any] = [
            checkpoint.expected_revision if run.revision > 0 else -1,
            run.revision,
            hashlib.sha1(known.key.doc).hexdigest() if known is not None else "",
            seal(dump_bytes(enc.head)),
            seal(dump_entry(enc.entry)),
            enc.first_message,
            len(enc.messages),
            enc.first_turn,
            len(enc.turns),
            len(enc.blobs),
            cid,
            self._commits_channel,
            f"{run.revision} {run.state} {run.run_id}",  # the commit notice
            int(checkpoint.cancels),
            *[seal(m) for m in enc.messages],
            *[seal(t) for t in enc.turns],
        ]
        for key, value in enc.blobs.items():
            args += [key, seal(value)]
        keys = [*self._keys(run.run_id), self.run_key(run.run_id, CANCEL_KEY)]
        for key, arg in extra:
            keys.append(key)
            args.extend(() if arg is None else (arg,))
        return CommitScript(run.run_id, run.revision, cid, keys, args, lua), enc

    async def _check_landed(
        self, checkpoint: Checkpoint, status: int, actual: int, asked: bytes | None = None
    ) -> None:
        """Raise what a commit script's status says went wrong (0: it landed; 4: the
        run keeps the cancel request ``asked``)."""
        run = checkpoint.run
        if status == 4:
            raise cancel_requested(run.run_id, asked, redact_url(self.url))
        if status == 1:
            self._known.drop(run.run_id)
            if actual >= 0:  # a head whose revision field r is damaged is no conflict
                await self._prior(run.run_id, self._keys(run.run_id)[0])
            raise ConflictError(
                run.run_id, checkpoint.expected_revision, None if actual < 0 else actual
            )
        if status != 0:
            raise CorruptCheckpoint(
                f"invalid run {run.run_id!r} in {redact_url(self.url)}: logs do not match its head"
            )

    async def _landed(
        self,
        checkpoint: Checkpoint,
        script: CommitScript,
        enc: EncodedCommit,
        announced: bool,
        pairs: Pairs,
    ) -> None:
        """Remember the head that landed and move the run in the index (and into the
        sets of the tags ``pairs`` it got)."""
        run = checkpoint.run
        self._known.put(run.run_id, Prior(_Known(run.revision, script.args[3]), enc.head))
        self._runs.landed(run.run_id, micros(run.updated_at), run.revision, pairs)
        if not announced:  # nothing would repair the index: move it now
            await self._runs.flush()

    async def _scripts(self, batch: list[CommitScript]) -> list[Outcome | Exception]:
        """Run the commit scripts of a batch in one round trip, each announced to the run
        index before it (the round trip also carries the index moves of the commits
        before) and waited for on its replicas (``_replicas``). Per script: (status,
        revision found, whether the announcement was written), or its own error (a
        ``StoreError`` for one that landed on fewer replicas than asked); scripts the
        server lost are loaded and sent again."""
        outcomes: list[Outcome | Exception | None] = [None] * len(batch)
        todo = list(range(len(batch)))
        for _ in range(2):
            commands: list[Command] = []
            taken = self._runs.take_moves(commands)
            first = len(commands)
            scripts: list[tuple[str, Command]] = []
            for i in todo:
                script = batch[i]
                self._replication.doubt(script.run_id, script.keys[0], script.cid, script.revision)
                commands.append(self._runs.announcement(script.run_id, script.revision))
                keys, args = script.keys, script.args
                scripts.append((keys[0], ("EVALSHA", script.lua.sha, len(keys), *keys, *args)))
            trip = self._replication.round_trip(commands, scripts)
            results, replies, shorts = await self._call(trip)
            await self._runs.settled(taken, results[:first], quiet=True)
            lost = []
            for n, i in enumerate(todo):
                announced, outcome = results[first + n], replies[n]
                if isinstance(outcome, NoScriptError):
                    lost.append(i)
                elif isinstance(outcome, Exception):
                    outcomes[i] = self._error(outcome)
                else:
                    announced_ok = not isinstance(announced, Exception)
                    outcomes[i] = self._replicated(batch[i], outcome, announced_ok, shorts[n])
            if not lost:
                break
            for lua in {batch[i].lua.script for i in lost}:
                await self._call(self._client.script_load(lua))
            todo = lost
        unloaded = f"Redis store {redact_url(self.url)!r}: the commit script does not load"
        return [StoreError(unloaded) if o is None else o for o in outcomes]

    def _replicated(
        self, script: CommitScript, outcome: Any, announced: bool, short: str | None
    ) -> Outcome | Exception:
        """The outcome of a commit script that ran. Every commit is doubted from the
        moment it is sent until it is known: refused, or landed on the replicas asked
        for. One that landed on fewer (``short`` says how) stays doubted, a
        ``StoreError``; so does one whose reply never came."""
        status, actual, token, asked = read_reply(outcome)
        if status == 0 and short is not None:
            what = f"the commit of run {script.run_id!r} at revision {script.revision}"
            error = self._replication.error(what, short)
            if token:  # a lease no replica may have: never handed out
                error = Unconfirmed(str(error), token)
            return error
        self._replication.forget(script.run_id)
        return (status, actual, announced, token, asked)

    def _failed(self, exc: BaseException) -> BaseException:
        """What each commit of a round trip that failed as a whole raises (a new error
        each, from the same Redis error)."""
        if not isinstance(exc, StoreError):
            return self._error(exc)
        error = StoreError(str(exc))
        error.__cause__ = exc.__cause__
        return error

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events of the revisions after ``after_revision``."""
        after_revision, limit = checked_events(run_id, after_revision, limit)
        head_key, c_key, *_ = self._keys(run_id)
        doc, r = await self._call(self._client.hmget(head_key, ["doc", "r"]))
        if doc is None:
            raise RunNotFound(run_id)
        run = f"run {run_id!r} in {redact_url(self.url)}"
        head = _load_head(doc, run)
        check_run_id(head, run_id, run)
        stored = _checked_r(r, head, run)
        what = f"events of {run}"
        found: list[Event] = []
        start = max(after_revision + 1, 0)
        while limit is None or len(found) < limit:
            chunk = await self._call(
                self._client.lrange(c_key, start, min(start + 255, MAX_REVISION))
            )
            if not chunk:
                break
            entries = _entries(chunk, start, what)
            check_log(entries, start, None, what)
            found += decode_events(entries, run_id, what=what)
            start += len(chunk)
        if limit is None or len(found) < limit:
            check_log([], start, stored, what)
        return found if limit is None else found[:limit]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Runs, newest update first, from the run index (announced commits repaired
        first); with ``tags``, the candidates of the tags' sets whose heads carry them."""
        limit = checked_listing(state, updated_after, limit, cursor)
        wanted = check_tag_filter(tags)
        await self._runs.repair(self._head_scores)
        damaged: list[DamagedRun] = []
        if wanted:
            candidates = [(run_id, -1) for run_id in sorted(await self._runs.tagged(wanted))]
            summaries = await self._summaries(candidates, damaged)
            listed = (summaries, state, updated_after, limit, cursor, wanted)
            return attrs.evolve(page_of_tagged(*listed), damaged=tuple(damaged))
        top: tuple[int, str] | None = None
        if cursor is not None:
            at, after_id = decode_cursor(cursor)
            top = (micros(at), after_id)
        low = f"({micros(updated_after)}" if updated_after is not None else "-inf"
        high = str(top[0]) if top else "+inf"
        found: list[RunSummary] = []
        offset = 0
        while len(found) <= limit:
            batch: list[Any] = await self._call(
                self._client.zrevrangebyscore(self._index, high, low, offset, 200, withscores=True)
            )
            if not batch:
                break
            offset += len(batch)
            scored = [(m.decode(), int(s)) for m, s in batch]
            scored = [(m, s) for m, s in scored if top is None or (s, m) < top]
            summaries = await self._summaries(scored, damaged)
            found += [s for s in summaries if state is None or s.state == state]
        page = tuple(found[:limit])
        more = len(found) > limit and bool(page)
        cursor_out = encode_cursor(page[-1]) if more else None
        return RunPage(page, cursor_out, tuple(damaged))

    async def _summaries(
        self, scored: list[tuple[str, int]], damaged: list[DamagedRun]
    ) -> list[RunSummary]:
        """Summaries from the heads (the truth); index entries that lag are repaired, and
        runs whose head cannot be read are left out and named in ``damaged`` (a score
        below 0: not read from the index, nothing to repair)."""
        pipe = self._client.pipeline(transaction=False)
        for run_id, _ in scored:
            pipe.hmget(self._keys(run_id)[0], ["doc", "r"])
        docs = await self._call(pipe.execute())
        found: list[RunSummary] = []
        for (run_id, score), (doc, r) in zip(scored, docs, strict=True):
            if doc is None:
                continue
            what = f"run {run_id!r} in {redact_url(self.url)}"
            try:
                head = _load_head(doc, what)
                check_run_id(head, run_id, what)
                _checked_r(r, head, what)
                summary = head_summary(head, what=f"head of {what}")
            except CorruptCheckpoint as exc:
                damaged.append(DamagedRun(run_id, str(exc)))
                continue
            if score >= 0 and micros(summary.updated_at) != score:
                fixed = {run_id: micros(summary.updated_at)}
                await self._call(self._client.zadd(self._index, fixed, xx=True))
            found.append(summary)
        return found

    def forget(self, run_id: str) -> None:
        """Forget the run's head this store remembers from its last commit or load (it
        builds the next commit on it). For a writer that changed the run's records
        without the store (a repair, a test that damages them): the next commit or load
        reads the head from the database again."""
        checked_run_id(run_id)
        self._known.drop(run_id)

    async def delete(self, run_id: str) -> bool:
        """Remove the run's keys (head, commit log with events, parts, blobs, cancel
        request) and index entry."""
        checked_run_id(run_id)
        self._runs.forget_landed(run_id)
        self._replication.forget(run_id)
        keys = [*self._keys(run_id), self.run_key(run_id, CANCEL_KEY)]  # all or none
        doc = await self._call(self._client.hget(keys[0], "doc"))
        pairs = frozenset() if doc is None else head_pairs(doc, f"run {run_id!r}")
        removed = await self._call(self._client.delete(*keys))
        lease = [self.run_key(run_id, n) for n in ("lease", "fence", "taker", "last")]
        await self._call(self._client.delete(*lease))  # a run made again starts afresh
        await self._runs.forget(run_id, pairs)
        self._known.drop(run_id)
        return bool(removed)

    async def _head_scores(self, run_ids: list[str]) -> list[tuple[int, int, Pairs] | None]:
        """(revision, index score, tags) of each run's head; None for a run not stored."""
        pipe = self._client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(self._keys(run_id)[0], "doc")
        docs = await self._call(pipe.execute())
        what = f"run head in {redact_url(self.url)}"
        found: list[tuple[int, int, Pairs] | None] = []
        for doc in docs:
            if doc is None:
                found.append(None)
                continue
            summary = head_summary(_load_head(doc, what))
            pairs = frozenset(summary.tags.items())
            found.append((summary.revision, micros(summary.updated_at), pairs))
        return found

    async def aclose(self) -> None:
        """Send the last index moves, close the connection pool."""
        with contextlib.suppress(StoreError):
            await self._runs.flush()
        with contextlib.suppress(*FAILURES):
            await self._wire.aclose()
            await self._client.aclose()


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _revision(head: Any, what: str) -> int:
    revision = head.get("revision") if isinstance(head, dict) else None
    if type(revision) is not int:
        raise CorruptCheckpoint(f"invalid {what}: no revision")
    return revision


def _checked_r(r: bytes | str | None, head: Any, what: str) -> int:
    """The head's revision, checked against ``r``, the copy of it the commit script
    compares (outside the head's checksum): a damaged copy is ``CorruptCheckpoint``
    naming it, never a false ``ConflictError`` on every later commit."""
    revision = _revision(head, what)
    if r is None or _bytes(r) != str(revision).encode():
        raise CorruptCheckpoint(
            f"invalid {what}: its revision field r holds {r!r}, its head revision {revision}"
        )
    return revision


def _load_head(doc: bytes | str, what: str) -> Any:
    """A stored head document, checked against its checksum."""
    return load_json(unseal(_bytes(doc), f"head of {what}"), what)


def _entries(items: list[Any], first: int, what: str) -> list[tuple[int, Any]]:
    """Commit log entries (of revisions ``first``...) as documents, checksums checked."""
    return [
        (
            first + i,
            load_entry(
                unseal(_bytes(e), f"commit log entry of revision {first + i} of {what}"), what
            ),
        )
        for i, e in enumerate(items)
    ]


def _parse_list(items: list[bytes], what: str) -> list[Any]:
    parsed = load_json(b"[" + b",".join(items) + b"]", what)
    return parsed  # type: ignore[no-any-return]
