"""The registry of consumer groups: which groups follow every item stream (the persister's, one
per bridge), in a Redis set beside the items registry.

Every reader registers its group as it looks for streams, and makes every registered group on
each stream it finds, from the stream's first entry (see ``seckill.engine.group_reader``). The
registry dies with Redis: SQL keeps a durable copy (``seckill.services.stream_groups``), which a
recovery puts back with ``register_groups`` before it gives the streams their events back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.exceptions import ResponseError

from seckill.engine.base import ShardCounts, registered_items
from seckill.engine.cluster import RedisClient
from seckill.engine.keys import item_keys, stream_groups_registry


async def create_group(redis: RedisClient, stream: str, group: str) -> None:
    """``group`` on ``stream`` from its first entry (and the stream, if missing), unless there."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def register_groups(
    redis: RedisClient, prefix: str, groups: Sequence[str], streams: Sequence[str]
) -> None:
    """Put ``groups`` in the registry and make each on every one of ``streams`` (with the
    stream, if missing) from its first entry, unless there: what recovery does before it gives
    a stream events back, so no trim drops one a registered group has not read."""
    if not groups:
        return
    await redis.sadd(stream_groups_registry(prefix), *groups)
    for stream in streams:
        for group in groups:
            await create_group(redis, stream, group)


async def registered_groups(redis: RedisClient, prefix: str) -> list[str]:
    """The groups that follow every item stream (see the module's docstring)."""
    return sorted(cast(set[str], await redis.smembers(stream_groups_registry(prefix))))


async def retire_group(redis: RedisClient, prefix: str, group: str) -> int:
    """Take ``group`` out of service for good: off the registry, and off every item stream
    (what it had not acknowledged is trimmed as the others move on). Returns the streams it
    left. A reader of that group still running registers it again within a second."""
    await redis.srem(stream_groups_registry(prefix), group)
    shard_counts = ShardCounts(redis, prefix)
    left = 0
    for item_id in await registered_items(redis, prefix):
        for shard in range(await shard_counts.of(item_id)):
            try:
                left += int(
                    await redis.xgroup_destroy(item_keys(item_id, prefix, shard).events, group)
                )
            except ResponseError:  # no such stream
                continue
    return left
