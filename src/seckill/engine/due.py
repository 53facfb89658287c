"""What the reaper reads to know when each item's shard is next due, in one round trip per node.

A look at a shard reads, in this order on its node: its stream's newest entry id, its hold
time (``hold_ms`` in its head) and its earliest deadline (and, on request, its earliest transfer
in transit). Every script that adds a hold, or changes the hold time, appends to the shard's
stream in the same step, so a stream with no entry after the id a look read had no such change
since: ``changed_streams`` says which streams did.

Commands of many shards go in one pipeline; callers send each pipeline to one node (on a
cluster, keys of one node; one Redis is one node), so a node that does not answer fails only
its own shards.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.typing import KeyT, StreamIdT

from seckill.engine.cluster import RedisClient
from seckill.engine.keys import ItemKeys, encoded

NO_ENTRY = "0-0"  # the id before every stream entry: a stream never written, or trimmed empty


@dataclass(frozen=True, slots=True)
class Look:
    """One shard as read by ``look``. Times are epoch ms on the clock of the shard's node."""

    last_id: str  # the stream's newest entry id (NO_ENTRY: none)
    hold_ms: int | None  # None: the shard is not loaded
    earliest_deadline: int | None  # None: no hold in the deadline index
    earliest_transit: int | None  # None: none in transit, or not asked


UNMAPPED = "?"  # a cluster slot the client's map gives no node (mid-failover)


def node_names(redis: RedisClient) -> Callable[[str], str]:
    """The node serving a key as the client's slot map says now ("" on one Redis; ``UNMAPPED``
    when the map has none: then every call for the key fails as a node that did not answer).
    Made once per pass: the reaper asks it of every shard."""
    if not isinstance(redis, RedisCluster):
        return lambda key: ""

    def node_of(key: str) -> str:
        try:
            node = redis.get_node_from_key(key)
        except RedisClusterException:
            return UNMAPPED
        return node.name if node else UNMAPPED

    return node_of


async def look(
    redis: RedisClient, shards: Sequence[ItemKeys], *, transit: Container[str] = ()
) -> list[Look]:
    """Each shard's newest stream id, hold time and earliest deadline (and its earliest transfer
    in transit, for the shards whose stream is in ``transit``), in one pipeline. The stream is
    read first, so a change made after it was read shows as a later entry."""
    if not shards:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for keys in shards:
            pipe.xrevrange(keys.events, count=1)
            pipe.hget(keys.item, "hold_ms")
            pipe.zrange(keys.deadlines, 0, 0, withscores=True)
            if keys.events in transit:
                pipe.zrange(keys.in_transit, 0, 0, withscores=True)
        replies = iter(await pipe.execute())
    looks = []
    for keys in shards:
        newest, hold_ms, deadline = next(replies), next(replies), next(replies)
        looks.append(
            Look(
                last_id=str(newest[0][0]) if newest else NO_ENTRY,
                hold_ms=None if hold_ms is None else int(hold_ms),
                earliest_deadline=_first_score(deadline),
                earliest_transit=_first_score(next(replies)) if keys.events in transit else None,
            )
        )
    return looks


async def changed_streams(redis: RedisClient, since: Mapping[str, str]) -> set[str]:
    """The streams of ``since`` that have an entry after the id given for each: one XREAD on one
    Redis; on a cluster (which refuses a command over several slots) one per stream, all in one
    pipeline."""
    if not since:
        return set()
    if isinstance(redis, RedisCluster):
        async with redis.pipeline(transaction=False) as pipe:
            for stream, after in since.items():
                pipe.xread({stream: after}, count=1)
            replies = await pipe.execute()
    else:
        streams: dict[KeyT, StreamIdT] = {encoded(s): after.encode() for s, after in since.items()}
        replies = [await redis.xread(streams, count=1)]
    return {stream for reply in replies for stream in _stream_names(reply)}


def _stream_names(reply: Any) -> list[str]:
    """The streams named in an XREAD reply (RESP2: a list of [stream, entries]; RESP3: a map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [str(stream) for stream in reply]
    return [str(stream) for stream, _ in cast(list[tuple[str, Any]], reply)]


def _first_score(reply: Any) -> int | None:
    return int(reply[0][1]) if reply else None
