"""Redis servers with replicas for the store tests: a primary with one replica, and a
Redis Cluster of three primaries with a replica each; replication cut off on purpose
(the primary keeps answering, its replica falls behind) and failovers.

Every wait here is for an event the servers report (``INFO``, ``CLUSTER INFO``,
``CLUSTER SLOTS``), polled, never a fixed time.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
from redis.crc import key_slot

from statekernel.errors import ConfigError
from statekernel.stores.redis._store import check_cluster_support
from statekernel.testing._servers import redis_server_path, start_redis, stop_server

from ..conftest import _free_cluster_port

__all__ = [
    "Cluster",
    "Pair",
    "acknowledges",
    "cut_off",
    "primary_with_replica",
    "reconnect",
    "replicated_cluster",
    "skip_without_cluster_support",
]

SHARDS = 3

Client = Any
"""A ``redis.Redis`` of one server or node (its commands are untyped)."""


def skip_without_cluster_support() -> None:
    """Skip the module when the installed redis-py runs no Redis Cluster store."""
    try:
        check_cluster_support(redis.__version__)
    except ConfigError as exc:  # the lowest redis-py the Redis store takes (arq's)
        pytest.skip(str(exc), allow_module_level=True)


_ASK_AGAIN = 10.0
"""Seconds after which a takeover the replica has not carried out is asked for again."""


def wait_until(
    check: Callable[[], bool],
    what: str,
    timeout: float = 60.0,
    state: Callable[[], object] = lambda: None,
) -> None:
    """Return once ``check()`` is true; fail naming ``what`` (and ``state()``, what the
    servers say) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what} ({state()})"
        time.sleep(0.02)


def acknowledges(primary: Client) -> bool:
    """Whether a replica of ``primary`` acknowledges a write to it (a probe key of its
    own slots), within 0.1 s."""
    pipe = primary.pipeline(transaction=False)
    pipe.set(_own_key(primary), "probe")
    pipe.execute_command("WAIT", 1, 100)
    acked = pipe.execute()[-1]
    return isinstance(acked, int) and acked >= 1


def _own_key(primary: Client) -> str:
    """A key that ``primary`` serves (on a Redis Cluster, one of its own slots)."""
    if str(primary.info("cluster").get("cluster_enabled")) != "1":
        return "probe"
    me = primary.execute_command("CLUSTER", "MYID")
    ranges = primary.execute_command("CLUSTER", "SLOTS")
    start, end = next((r[0], r[1]) for r in ranges if r[2][2] == me)
    return next(
        k for k in (f"probe-{n}" for n in range(100_000)) if start <= key_slot(k.encode()) <= end
    )


def cut_off(primary: Client) -> None:
    """Cut the primary's replicas off and keep them off (they may no longer ``PSYNC``):
    it goes on answering writes that no replica gets."""
    primary.execute_command("ACL", "SETUSER", "default", "-psync", "-sync")
    primary.execute_command("CLIENT", "KILL", "TYPE", "slave")
    wait_until(
        lambda: primary.info("replication").get("connected_slaves") == 0,
        "the primary's replicas are disconnected",
    )


def reconnect(primary: Client) -> None:
    """Let the primary's replicas in again; return once they have all its writes.

    Only ``PSYNC`` is allowed again: a replica refused ``PSYNC`` falls back to the old
    ``SYNC``, and one whose ``SYNC`` came in just after the change would replicate without
    ever acknowledging an offset (``WAIT`` would count it never). Refused ``SYNC``, it asks
    with ``PSYNC`` again. A replica that has not caught up within 20 s is cut off once more
    so that it syncs again."""
    primary.execute_command("ACL", "SETUSER", "default", "+psync")

    def caught_up() -> None:
        wait_until(
            lambda: acknowledges(primary),
            "a replica acknowledges the primary's writes",
            state=lambda: primary.info("replication"),
            timeout=20.0,
        )

    try:
        caught_up()
    except AssertionError:
        primary.execute_command("CLIENT", "KILL", "TYPE", "slave")
        caught_up()


def _start(folder: Path, *args: str, taken: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server of the tests' on a port free with its cluster bus port (apart from
    the ports ``taken``): its process and port, once it answers."""
    if redis_server_path() is None:
        pytest.skip("redis-server not found")  # the redis_url fixture skips first
    folder.mkdir(parents=True)
    args = ("--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1", *args)
    return start_redis(folder, args, choose_port=lambda: _free_cluster_port(taken))


@attrs.frozen
class Pair:
    """A primary (``url``, ``client``) and its replica."""

    url: str
    client: Client


def primary_with_replica(folder: Path) -> Iterator[Pair]:
    """A redis-server with a replica of its own, the replica caught up."""
    primary, port = _start(folder / "primary", taken=[])
    procs = [primary]
    try:
        replica = ("--replicaof", "127.0.0.1", str(port))
        procs.append(_start(folder / "replica", *replica, taken=[port])[0])
        client: Client = redis.Redis(host="127.0.0.1", port=port)
        try:
            wait_until(lambda: acknowledges(client), "the replica acknowledges writes")
            yield Pair(f"redis://127.0.0.1:{port}/0", client)
        finally:
            client.close()
    finally:
        for proc in procs:
            stop_server(proc)


@attrs.define
class Cluster:
    """A Redis Cluster of ``SHARDS`` primaries with a replica each, on loopback."""

    ports: list[int]
    clients: list[Client]

    @property
    def url(self) -> str:
        """The store URL of the cluster (one node's address: the client finds the rest)."""
        return f"redis://127.0.0.1:{self.ports[0]}?cluster=1"

    def client(self, port: int) -> Client:
        """A client of the node on ``port``."""
        return self.clients[self.ports.index(port)]

    def shard_of(self, key: str) -> tuple[int, int]:
        """The ports of the primary of ``key``'s slot and of its replica."""
        slot = key_slot(key.encode())
        for start, end, primary, *replicas in self.clients[0].execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return int(primary[1]), int(replicas[0][1])
        raise AssertionError(f"no node serves slot {slot}")

    def take_over(self, replica: int, primary: int) -> None:
        """``CLUSTER FAILOVER TAKEOVER`` on ``replica`` (no agreement of ``primary``);
        return once every node serves the new layout: the replica a primary, the old
        primary its replica (synced again: what only it had is gone), every node's slot
        map naming the new primary."""
        self.client(replica).execute_command("CLUSTER", "FAILOVER", "TAKEOVER")

        def promoted() -> bool:
            return bool(self.client(replica).info("replication")["role"] == "master")

        def settled() -> bool:
            demoted = self.client(primary).info("replication")["role"] == "slave"
            return promoted() and demoted and self._everywhere(replica)

        def state() -> object:
            return {
                port: (
                    client.info("replication")["role"],
                    client.execute_command("CLUSTER INFO").get("cluster_state"),
                )
                for port, client in zip(self.ports, self.clients, strict=True)
            }

        asked = [time.monotonic()]

        def promoted_or_asked() -> bool:
            """A takeover the replica dropped (a loaded machine) is asked for again, every
            ``_ASK_AGAIN`` seconds until the replica is promoted."""
            if promoted():
                return True
            if time.monotonic() - asked[0] >= _ASK_AGAIN:
                asked[0] = time.monotonic()
                self.client(replica).execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            return False

        wait_until(promoted_or_asked, f"node {replica} to be promoted", timeout=120.0, state=state)
        wait_until(settled, f"node {replica} took over from node {primary}", state=state)
        wait_until(lambda: acknowledges(self.client(replica)), "the old primary acknowledges")

    def _everywhere(self, primary: int) -> bool:
        """Whether every node is ok and names ``primary`` as the primary of slots."""
        for client in self.clients:
            info: Any = client.execute_command("CLUSTER INFO")
            if info.get("cluster_state") != "ok":
                return False
            owners = {int(s[2][1]) for s in client.execute_command("CLUSTER SLOTS")}
            if primary not in owners:
                return False
        return True

    def ready(self) -> bool:
        """Whether every node is ok, knows every node, and lists a replica for each
        range of slots."""
        for client in self.clients:
            info: Any = client.execute_command("CLUSTER INFO")
            if info.get("cluster_state") != "ok":
                return False
            if str(info.get("cluster_known_nodes")) != str(len(self.ports)):
                return False
            ranges = client.execute_command("CLUSTER SLOTS")
            if len(ranges) != SHARDS or any(len(r) < 4 for r in ranges):
                return False
        return all(acknowledges(c) for c in self.clients[:SHARDS])


def replicated_cluster(folder: Path) -> Iterator[Cluster]:
    """A Redis Cluster of ``SHARDS`` primaries and a replica each, once every node is ok
    and every replica synced."""
    ports: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[Client] = []
    try:
        for n in range(2 * SHARDS):
            # gossip often enough to agree on replicas quickly; a primary that a loaded
            # machine keeps from answering is never failed over by itself (only a test
            # fails a primary over)
            flags = ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
            flags += ["--cluster-replica-no-failover", "yes"]
            proc, port = _start(folder / f"node-{n}", *flags, taken=ports)
            procs.append(proc)
            ports.append(port)
        clients = [redis.Redis(host="127.0.0.1", port=p) for p in ports]
        for n in range(SHARDS):
            first, last = n * 16384 // SHARDS, (n + 1) * 16384 // SHARDS
            clients[n].execute_command("CLUSTER ADDSLOTS", *range(first, last))
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
        cluster = Cluster(ports, clients)

        def known() -> bool:
            infos: list[Any] = [c.execute_command("CLUSTER INFO") for c in clients]
            return all(str(i.get("cluster_known_nodes")) == str(len(ports)) for i in infos)

        wait_until(known, "every node knows every other")
        for n in range(SHARDS):
            primary_id = clients[n].execute_command("CLUSTER MYID")
            clients[SHARDS + n].execute_command("CLUSTER REPLICATE", primary_id)
        wait_until(cluster.ready, "the cluster is ok with a synced replica for every shard")
        yield cluster
    finally:
        for client in clients:
            client.close()
        for proc in procs:
            stop_server(proc)
