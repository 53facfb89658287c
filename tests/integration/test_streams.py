"""Where a stream's consumer groups stand (engine/streams.py), read for many item streams at
once: on one Redis and on a Redis Cluster, whose streams live on different primaries, each on
Redis 6.2 (no lag in XINFO GROUPS: the unread are counted) and 7."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from seckill.engine.keys import item_keys
from seckill.engine.streams import GROUP, GroupProgress, read_progress

STREAMS = [item_keys(item_id).events for item_id in (1, 2, 3)]


async def progress_of_several_streams(redis: Redis) -> None:
    # Stream 1: 5 entries, 3 delivered to the persister, 1 of them acknowledged.
    ids = [await redis.xadd(STREAMS[0], {"n": str(n)}) for n in range(5)]
    await redis.xgroup_create(STREAMS[0], GROUP, id="0")
    await redis.xreadgroup(GROUP, "c", {STREAMS[0]: ">"}, count=3)
    await redis.xack(STREAMS[0], GROUP, ids[0])
    # Stream 2: 2 entries, no group yet. Stream 3: no stream at all.
    for n in range(2):
        await redis.xadd(STREAMS[1], {"n": str(n)})

    first, second, third = await read_progress(redis, STREAMS)

    assert first.length == 5
    assert first.of(GROUP) == GroupProgress(pending=2, lag=2)
    assert first.of(GROUP).backlog == 4 and not first.drained
    assert second.length == 2 and not second.groups
    assert second.of(GROUP) == GroupProgress(pending=0, lag=2)  # every entry ahead of it
    assert third.length == 0 and not third.groups and not third.drained

    await redis.xreadgroup(GROUP, "c", {STREAMS[0]: ">"})
    await redis.xack(STREAMS[0], GROUP, *ids)
    [done] = await read_progress(redis, STREAMS[:1])
    assert done.of(GROUP).backlog == 0 and done.drained


Check = Callable[[Redis], Awaitable[None]]


@pytest.mark.parametrize("check", [progress_of_several_streams])
async def test_on_one_redis(check: Check, redis: Redis) -> None:
    await check(redis)


@pytest.mark.parametrize("check", [progress_of_several_streams])
async def test_on_a_cluster(check: Check, cluster_redis: RedisCluster) -> None:
    nodes = {cluster_redis.get_node_from_key(stream).port for stream in STREAMS}
    assert len(nodes) > 1, "the streams should live on several primaries"
    await check(cluster_redis)  # type: ignore[arg-type]
