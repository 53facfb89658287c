"""How long the oldest entry of a stream has waited for a consumer group (engine/streams.py's
``oldest_ages``, the gauge ``seckill_stream_oldest_age_seconds``): read from the entry ids, by
Redis's clock, on one Redis and on a Redis Cluster."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from seckill.engine.cluster import time_ms
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.engine.streams import GROUP, oldest_ages, read_progress

STREAMS = [item_keys(item_id, DEFAULT_PREFIX).events for item_id in (1, 2)]
HOUR_MS = 3_600_000


async def ages(redis: Redis) -> list[float]:
    progress = await read_progress(redis, STREAMS)
    return await oldest_ages(
        redis, [(s, GROUP, p.of(GROUP)) for s, p in zip(STREAMS, progress, strict=True)]
    )


async def the_oldest_entry_waiting(redis: Redis) -> None:
    now = await time_ms(redis, STREAMS[0])
    # Stream 1: three entries added an hour, half an hour and a minute ago, none delivered.
    added = [now - HOUR_MS, now - HOUR_MS // 2, now - 60_000]
    ids = [await redis.xadd(STREAMS[0], {"n": "1"}, id=f"{ms}-0") for ms in added]
    await redis.xgroup_create(STREAMS[0], GROUP, id="0")
    # Stream 2: one fresh entry, landed at once.
    fresh = await redis.xadd(STREAMS[1], {"n": "1"})
    await redis.xgroup_create(STREAMS[1], GROUP, id="0")
    await redis.xreadgroup(GROUP, "c", {STREAMS[1]: ">"})
    await redis.xack(STREAMS[1], GROUP, fresh)

    unread, landed = await ages(redis)
    assert 3600 <= unread < 3600 + 30  # none delivered: the first unread entry
    assert landed == 0

    # Two delivered, the first of them acknowledged: the oldest pending one counts.
    await redis.xreadgroup(GROUP, "c", {STREAMS[0]: ">"}, count=2)
    await redis.xack(STREAMS[0], GROUP, ids[0])
    pending, _ = await ages(redis)
    assert 1800 <= pending < 1800 + 30

    # The pending one acknowledged: the next unread, a minute old.
    await redis.xack(STREAMS[0], GROUP, ids[1])
    unread, _ = await ages(redis)
    assert 60 <= unread < 60 + 30

    await redis.xreadgroup(GROUP, "c", {STREAMS[0]: ">"})
    await redis.xack(STREAMS[0], GROUP, ids[2])
    assert await ages(redis) == [0.0, 0.0]


Check = Callable[[Redis], Awaitable[None]]


@pytest.mark.parametrize("check", [the_oldest_entry_waiting])
async def test_on_one_redis(check: Check, redis: Redis) -> None:
    await check(redis)


@pytest.mark.parametrize("check", [the_oldest_entry_waiting])
async def test_on_a_cluster(check: Check, cluster_redis: RedisCluster) -> None:
    await check(cluster_redis)  # type: ignore[arg-type]
