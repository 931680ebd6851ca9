"""The clients of a Redis store: a Redis Cluster's (with the redis-py release it needs)
or a single server's, built from the store's URL."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from statekernel.errors import ConfigError
from statekernel.stores.redis._cancelling import guard_client

__all__ = ["CLUSTER_NEEDS", "check_cluster_support", "client_for", "cluster_for"]


CLUSTER_NEEDS = (6, 2)
"""The redis-py release from which a cluster pipeline runs a transaction (the commit's
``MULTI``/``EXEC`` on one hash slot); before it, redis-py refuses one."""


def check_cluster_support(version: str) -> None:
    """``ConfigError`` unless redis-py ``version`` runs transactions on a Redis Cluster."""
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if found < CLUSTER_NEEDS:
        raise ConfigError(
            f"a Redis Cluster store needs redis-py {'.'.join(map(str, CLUSTER_NEEDS))} or"
            f" newer (installed: {version}): older releases run no transaction on a cluster"
        )


def cluster_for(url: str) -> RedisCluster:
    """A Redis Cluster client that starts from the node of ``url`` (it finds the others);
    a cluster has one database, so a path other than ``/`` or ``/0`` is refused."""
    path = urlsplit(url).path.strip("/")
    if path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only, not {path!r}")
    url = urlunsplit(urlsplit(url)._replace(path=""))
    client = RedisCluster.from_url(url, decode_responses=False)  # connects on first use
    check_cluster_support(redis.__version__)
    guard_client(client)
    return client


def client_for(url: str) -> aioredis.Redis:
    """A client for ``url``; its options are checked now (``redis-py`` would raise a
    ``TypeError`` for an unknown one at the first connection)."""
    client = aioredis.from_url(url, decode_responses=False)
    guard_client(client)
    pool: Any = client.connection_pool
    pool.make_connection()  # builds the connection object, no I/O
    return client
