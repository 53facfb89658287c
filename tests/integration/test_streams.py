"""Where a stream's consumer groups stand (engine/streams.py), read for many item streams at
once: on one Redis and on a Redis Cluster, whose streams live on different primaries, each on
Redis 6.2 (no lag in XINFO GROUPS: the unread are counted) and 7."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.engine.streams import GROUP, GroupProgress, read_progress

STREAMS = [item_keys(item_id, DEFAULT_PREFIX).events for item_id in (1, 2, 3)]


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


@pytest.mark.redis_variants("redis7")
async def test_a_lag_counted_for_entries_redis_no_longer_has_is_none(redis: Redis) -> None:
    """A Redis restarted from an older file keeps counts of entries it no longer has: XINFO
    GROUPS then says a group that read the stream's last entry lags (here by 40). It is drained:
    nothing is after what it read. (XSETID ENTRIESADDED makes the same count without a restart.)"""
    ids = [await redis.xadd(STREAMS[0], {"n": str(n)}) for n in range(3)]
    await redis.xgroup_create(STREAMS[0], GROUP, id="0")
    await redis.xreadgroup(GROUP, "c", {STREAMS[0]: ">"})
    await redis.xack(STREAMS[0], GROUP, *ids)
    await redis.execute_command("XSETID", STREAMS[0], ids[-1], "ENTRIESADDED", 43)
    [group] = await redis.xinfo_groups(STREAMS[0])
    assert group["lag"] == 40 and group["last-delivered-id"] == ids[-1]

    [progress] = await read_progress(redis, STREAMS[:1])

    assert progress.of(GROUP) == GroupProgress(pending=0, lag=0)
    assert progress.drained
    # A lag it does have is still counted as Redis says.
    await redis.xadd(STREAMS[0], {"n": "3"})
    [behind] = await read_progress(redis, STREAMS[:1])
    assert behind.of(GROUP).lag == 41 and not behind.drained
