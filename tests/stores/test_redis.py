"""Redis store: the run index across clients killed mid-commit, AUTH, TLS, no leaked passwords."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import attrs
import pytest
import redis as redis_sync
from redis.exceptions import ResponseError

from statekernel.errors import ConfigError, StoreError
from statekernel.stores import Checkpoint, RedisStore, open_store, redact_url
from statekernel.stores.redis._wire import Wire
from statekernel.testing._store_cases import T0, next_revision, sample_run

from .conftest import REDIS_PASSWORD, free_port, serve, stop

pytestmark = pytest.mark.redis

PASSWORD = REDIS_PASSWORD


class ClientKilled(Exception):
    """Stands for the process dying at this point."""


def _die(*args: object, **kwargs: object) -> None:
    raise ClientKilled


# -- the run index ---------------------------------------------------------------------


@pytest.fixture(params=["redis", "redis_cluster"])
def one_or_cluster_url(request: pytest.FixtureRequest) -> str:
    """A Redis store URL on one server, then on a Redis Cluster."""
    return str(request.getfixturevalue(f"{request.param}_store_url"))


def sync_client(url: str) -> redis_sync.Redis | redis_sync.RedisCluster:
    """A plain client of the server (or cluster) of a store URL."""
    base = url.split("?")[0]
    if "cluster=1" in url:
        return redis_sync.RedisCluster.from_url(base)
    return redis_sync.Redis.from_url(base)


async def test_index_survives_a_client_killed_after_its_commit(one_or_cluster_url: str) -> None:
    redis_store_url = one_or_cluster_url
    writer = open_store(redis_store_url)
    assert isinstance(writer, RedisStore)
    run = sample_run("r")
    await writer.commit(Checkpoint.between(None, run))
    later = attrs.evolve(next_revision(run), updated_at=T0 + timedelta(hours=2))
    writer._runs.landed = _die  # type: ignore[method-assign]
    with pytest.raises(ClientKilled):
        await writer.commit(Checkpoint.between(run, later))
    with pytest.raises(ClientKilled):
        await writer.commit(Checkpoint.between(None, sample_run("fresh", at=T0)))
    reader = open_store(redis_store_url)
    recent = await reader.list_runs(updated_after=T0 + timedelta(hours=1))
    assert [(s.run_id, s.revision, s.updated_at) for s in recent.runs] == [
        ("r", 1, later.updated_at)
    ]
    assert [s.run_id for s in (await reader.list_runs()).runs] == ["r", "fresh"]
    client = sync_client(redis_store_url)
    prefix = redis_store_url.split("prefix=")[1]
    assert client.zcard(f"{prefix}:runs:pending") == 0, "repaired announcements stay"
    assert client.zscore(f"{prefix}:runs", "r") == (T0 + timedelta(hours=2)).timestamp() * 1e6
    client.close()
    await writer.aclose()
    await reader.aclose()


async def test_index_announcements_settle_on_the_next_round_trip(redis_store_url: str) -> None:
    store = open_store(redis_store_url)
    client = redis_sync.Redis.from_url(redis_store_url.split("?")[0])
    pending = f"{redis_store_url.split('prefix=')[1]}:runs:pending"
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    for _ in range(3):
        nxt = next_revision(run)
        await store.commit(Checkpoint.between(run, nxt))
        run = nxt
        assert client.zrange(pending, 0, -1, withscores=True) == [(b"r", run.revision)]
    assert [s.revision for s in (await store.list_runs()).runs] == [run.revision]
    assert client.zcard(pending) == 0
    client.script_flush()
    for _ in range(2):  # both scripts are loaded again
        nxt = next_revision(run)
        await store.commit(Checkpoint.between(run, nxt))
        run = nxt
    assert await store.load("r") == run
    await store.aclose()
    assert client.zcard(pending) == 0
    store = open_store(redis_store_url)
    assert await store.delete("r") is True
    assert client.zcard(pending.removesuffix(":pending")) == 0
    client.close()
    await store.aclose()


# -- the commit path's round trip ------------------------------------------------------


async def test_round_trip_replies_in_order_with_errors_in_place(redis_store_url: str) -> None:
    store = RedisStore(redis_store_url)
    wire = Wire(store.client)
    key = store.run_key("wire", "n")
    commands = [("SET", key, 1), ("HGET", key, "x"), ("INCR", key), ("GET", key)]
    replies = await wire.round_trip(commands)
    assert replies[0] == b"OK"
    assert isinstance(replies[1], ResponseError), "WRONGTYPE is not in its place"
    assert replies[2:] == [2, b"2"]
    await wire.aclose()
    await store.aclose()


class _PipelineOnly:
    """A client with pipelines but no connection pool of its own (like a Cluster client)."""

    def __init__(self, client: object) -> None:
        self.pipeline = client.pipeline  # type: ignore[attr-defined]


async def test_round_trip_through_a_client_without_a_pool(redis_store_url: str) -> None:
    store = RedisStore(redis_store_url)
    wire = Wire(_PipelineOnly(store.client))
    key = store.run_key("wire", "p")
    replies = await wire.round_trip([("SET", key, 1), ("HGET", key, "x"), ("INCR", key)])
    assert replies[0] is True
    assert isinstance(replies[1], ResponseError)
    assert replies[2] == 2
    await wire.aclose()
    await store.aclose()


async def test_round_trip_cancelled_or_cut_leaves_no_stale_replies(redis_store_url: str) -> None:
    store = RedisStore(redis_store_url)
    client, wire = store.client, Wire(store.client)
    key = store.run_key("wire", "list")
    assert await wire.round_trip([("PING",)]) == [b"PONG"]  # a connection is kept
    waiting = asyncio.ensure_future(wire.round_trip([("BLPOP", key, 5)]))
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await client.rpush(key, b"late")  # the cancelled BLPOP's connection is gone: nobody pops
    assert await wire.round_trip([("LRANGE", key, 0, -1), ("PING",)]) == [[b"late"], b"PONG"]
    admin = redis_sync.Redis.from_url(redis_store_url.split("?")[0])
    admin.client_kill_filter(_type="normal", skipme=True)  # the server cuts every connection
    admin.close()
    assert await wire.round_trip([("LLEN", key)]) == [1], "a cut connection is not renewed"
    assert await wire.round_trip([("LLEN", key)]) == [1]
    await wire.aclose()
    await store.aclose()


# -- AUTH and TLS ----------------------------------------------------------------------


async def _round_trip(url: str) -> None:
    store = open_store(url)
    run = sample_run("auth")
    await store.commit(Checkpoint.between(None, run))
    nxt = next_revision(run)
    await store.commit(Checkpoint.between(run, nxt))
    assert await store.load("auth") == nxt
    assert await store.load("auth", revision=0) == run
    assert [s.run_id for s in (await store.list_runs()).runs] == ["auth"]
    assert await store.delete("auth") is True
    await store.aclose()


async def test_redis_with_a_password(redis_password_url: str) -> None:
    await _round_trip(redis_password_url.replace("redis://", f"redis://:{PASSWORD}@"))


@pytest.mark.parametrize("given", ["", ":wrong-RECOGNISABLE-pw@"])
async def test_redis_refuses_a_wrong_password_without_leaking_it(
    redis_password_url: str, given: str
) -> None:
    url = redis_password_url.replace("redis://", f"redis://{given}")
    store = open_store(url)
    with pytest.raises(StoreError) as info:
        await store.load("auth")
    text = f"{info.value} {info.value!r} {store!r} {info.value.__cause__!r}"
    assert "RECOGNISABLE" not in text
    assert redact_url(url) in str(info.value)
    await store.aclose()


def test_redis_store_repr_hides_the_password() -> None:
    store = open_store(f"redis://user:{PASSWORD}@127.0.0.1:1/0")
    assert PASSWORD not in repr(store)
    assert "***" in repr(store)


@pytest.fixture(scope="session")
def tls_url(server_dir: Path) -> Iterator[tuple[str, Path]]:
    """A redis-server on TLS only (a throwaway CA and certificate); its URL and CA file."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    _certificates(server_dir)
    port = free_port()
    args = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
    args += ["--tls-cert-file", str(server_dir / "server.crt")]
    args += ["--tls-key-file", str(server_dir / "server.key")]
    args += ["--tls-ca-cert-file", str(server_dir / "ca.crt"), "--requirepass", PASSWORD]
    url = f"rediss://127.0.0.1:{port}/0"
    ca = str(server_dir / "ca.crt")
    try:
        proc = serve(server_dir, args, url, ssl_ca_certs=ca, password=PASSWORD)
    except redis_sync.ConnectionError:
        pytest.skip("this redis-server does not support TLS")
    yield url, server_dir / "ca.crt"
    stop(proc)


def _certificates(folder: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-out", "ca.crt", "-days", "1", "-subj", "/CN=statekernel test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=127.0.0.1")  # fmt: skip
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "1",
            "-extfile", "ext.cnf")  # fmt: skip


async def test_rediss_with_a_password(tls_url: tuple[str, Path]) -> None:
    url, ca = tls_url
    await _round_trip(
        url.replace("rediss://", f"rediss://:{PASSWORD}@") + f"?ssl_ca_certs={ca}&prefix=tls"
    )


async def test_rediss_with_an_unknown_certificate_fails_without_leaking(
    tls_url: tuple[str, Path],
) -> None:
    url = tls_url[0].replace("rediss://", f"rediss://:{PASSWORD}@")
    store = open_store(url)
    with pytest.raises(StoreError) as info:
        await store.load("x")
    assert PASSWORD not in f"{info.value} {info.value!r} {store!r}"
    await store.aclose()


# -- bounded memory ----------------------------------------------------------------------


async def test_head_cache_stays_bounded_over_many_runs(redis_store_url: str) -> None:
    store = RedisStore(redis_store_url)
    runs = [sample_run(f"r{i}") for i in range(600)]
    for run in runs:
        await store.commit(Checkpoint.between(None, run))
    assert len(store._known) == store._known.size < len(runs)
    first = runs[0]  # fell out of the cache: its next commit reads the head
    await store.commit(Checkpoint.between(first, next_revision(first)))
    assert (await store.load("r0")).revision == 1
    await store.aclose()


@pytest.mark.parametrize(
    ("query", "wrong"),
    [("cluster=maybe", "cluster='maybe'"), ("cluster=1&x=1", "")],
)
def test_a_bad_cluster_option_is_a_config_error(query: str, wrong: str) -> None:
    with pytest.raises(ConfigError, match="bad Redis URL") as info:
        RedisStore(f"redis://127.0.0.1:1/0?{query}")
    assert wrong in str(info.value)


def test_a_cluster_has_database_0_only() -> None:
    with pytest.raises(ConfigError, match="database 0 only, not '2'"):
        RedisStore("redis://127.0.0.1:1/2?cluster=yes")
    from statekernel.stores.redis._store import CLUSTER_NEEDS

    older = tuple(int(n) for n in redis_sync.__version__.split(".")[:2]) < CLUSTER_NEEDS
    if older:  # the lowest redis-py the store takes: a cluster is refused, saying why
        with pytest.raises(ConfigError, match=r"needs redis-py 6\.2"):
            RedisStore("redis://127.0.0.1:1/0?cluster=true")
    else:
        assert RedisStore("redis://127.0.0.1:1/0?cluster=true").prefix == "statekernel"


def test_a_cluster_store_needs_a_redis_py_that_runs_cluster_transactions() -> None:
    from statekernel.stores.redis._store import check_cluster_support

    for version in ("6.2.0", "7.0.1", "8.1.0", "10.0.0b1"):
        check_cluster_support(version)
    for version in ("5.3.1", "6.1.0", "4.6.0"):
        with pytest.raises(ConfigError, match=rf"redis-py 6\.2 or newer \(installed: {version}\)"):
            check_cluster_support(version)
