"""One Redis or a Redis Cluster: the same engine runs on both.

Every key of an item shares the hash tag ``{item:<id>}``, so each script and each read of one
item touches one slot. What differs on a cluster is only where a command goes: redis-py's
``RedisCluster`` routes each by its key; commands over keys of several slots (one XREADGROUP over
every stream) must be split per key.
"""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

RedisClient: TypeAlias = Redis | RedisCluster
"""A client of one Redis, or of a Redis Cluster (configured by ``Settings.redis_cluster``)."""


def is_cluster(redis: RedisClient) -> bool:
    return isinstance(redis, RedisCluster)
