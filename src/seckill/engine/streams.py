"""Where each item's stream stands: the one answer to "how far behind is SQL".

Every item's stream has one consumer group per sink; the persister's, ``GROUP``, lands the
entries in SQL. A group's entries are in one of three places: acknowledged (done), pending
(delivered, not acknowledged yet) or unread (not delivered yet: its *lag*). Its *backlog* is
pending + lag: what is not in the sink yet.

Redis 7 says a group's lag in XINFO GROUPS (nil when it cannot tell, after deletions); Redis 6.2
never does. Then the entries after the group's last delivered one are counted with XRANGE, up to
``UNREAD_COUNT_CAP`` (past it the count says "at least this many"). A lag Redis does say is
checked against the stream: it counts entries added and read since the group was made, and a
Redis restarted from an older file keeps counts of entries it no longer has, so a group that has
read the stream's last entry lags by nothing, whatever the count says. Reads of many streams take
one pipeline, and one more only for the groups whose lag Redis did not say or said above zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.exceptions import ResponseError

from seckill.domain.dead_letters import PERSISTER_GROUP
from seckill.engine.cluster import RedisClient, time_ms
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import ItemKeys
from seckill.observability import metrics

GROUP = PERSISTER_GROUP
"""The persister's consumer group on every item stream."""

UNREAD_COUNT_CAP = 100_000
"""Unread entries counted at most where Redis keeps no lag: the count is read every second (the
dashboard, each scrape), and past this many the answer is "far behind" anyway."""


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One consumer group's position in one stream."""

    pending: int  # delivered to a consumer, not acknowledged yet
    lag: int  # not delivered yet
    # The id of the last entry delivered: the unread ones come after it.
    last_delivered: str = field(default="0-0", compare=False)

    @property
    def backlog(self) -> int:
        """Entries the group's sink does not have yet."""
        return self.pending + self.lag


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """One stream's length and every consumer group's position in it."""

    length: int  # XLEN: the backlog plus entries acknowledged but not trimmed yet
    groups: Mapping[str, GroupProgress] = field(default_factory=dict)  # by group name

    def of(self, group: str = GROUP) -> GroupProgress:
        """A group's position; a group not created yet has every entry ahead of it."""
        return self.groups.get(group) or GroupProgress(pending=0, lag=self.length)

    @property
    def drained(self) -> bool:
        """Has some group been created, and every group received and acknowledged every entry?"""
        return bool(self.groups) and all(g.backlog == 0 for g in self.groups.values())


def group_progress(group: Mapping[str, Any], *, unread: int | None = None) -> GroupProgress:
    """A group's position from its entry in the XINFO GROUPS reply.

    ``unread``: the entries after its ``last-delivered-id``, counted (``count_unread``); needed
    only when the reply has no lag (Redis 6.2, or Redis 7 when it cannot tell)."""
    lag = group.get("lag")
    if lag is None:
        if unread is None:
            raise ValueError(f"group {group['name']!r}: Redis gave no lag, count the unread")
        lag = unread
    return GroupProgress(
        pending=int(group["pending"]),
        lag=int(lag),
        last_delivered=str(group.get("last-delivered-id") or "0-0"),
    )


async def read_progress(redis: RedisClient, streams: Sequence[str]) -> list[StreamProgress]:
    """Length and groups of every stream, in order: one pipeline (XLEN and XINFO GROUPS of
    each), and one more to count the unread entries of groups Redis gave no lag for."""
    if not streams:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xlen(stream)
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)
    lengths: list[int] = []
    groups_of: list[list[dict[str, Any]]] = []
    for length, groups in zip(replies[0::2], replies[1::2], strict=True):
        if isinstance(length, Exception):
            raise length
        if isinstance(groups, ResponseError):  # no stream yet: no group either
            groups = []
        elif isinstance(groups, Exception):
            raise groups
        lengths.append(int(length))
        groups_of.append(cast(list[dict[str, Any]], groups))
    without_lag = [
        (stream, group)
        for stream, groups in zip(streams, groups_of, strict=True)
        for group in groups
        if group.get("lag") is None
    ]
    lagging = [
        (stream, group)
        for stream, groups in zip(streams, groups_of, strict=True)
        for group in groups
        if group.get("lag")
    ]
    counts = await count_unread(redis, [*without_lag, *lagging], caps=[
        *(UNREAD_COUNT_CAP for _ in without_lag), *(1 for _ in lagging)
    ])  # fmt: skip
    counted = {
        (stream, group["name"]): n
        for (stream, group), n in zip(without_lag, counts[: len(without_lag)], strict=True)
    }
    for (stream, group), n in zip(lagging, counts[len(without_lag) :], strict=True):
        if n == 0:  # nothing after what it read: the count outlived the entries it counted
            counted[stream, group["name"]] = 0
    return [
        StreamProgress(
            length=length,
            groups={
                g["name"]: group_progress(
                    {**g, "lag": None} if (stream, g["name"]) in counted else g,
                    unread=counted.get((stream, g["name"])),
                )
                for g in groups
            },
        )
        for stream, length, groups in zip(streams, lengths, groups_of, strict=True)
    ]


async def count_unread(
    redis: RedisClient,
    groups: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    caps: Sequence[int] | None = None,
) -> list[int]:
    """For each (stream, XINFO GROUPS entry): the entries after the group's last delivered one,
    up to its cap (``UNREAD_COUNT_CAP`` by default), in one pipeline. Counted rather than
    compared with the newest id: the last delivered entry may have been deleted, and then it is
    never delivered."""
    if not groups:
        return []
    caps = caps or [UNREAD_COUNT_CAP] * len(groups)
    async with redis.pipeline(transaction=False) as pipe:
        for (stream, group), cap in zip(groups, caps, strict=True):
            pipe.xrange(stream, min="(" + group["last-delivered-id"], count=cap)
        pages = await pipe.execute()
    return [len(page or ()) for page in pages]


async def oldest_ages(
    redis: RedisClient, groups: Sequence[tuple[str, str, GroupProgress]]
) -> list[float]:
    """For each (stream, group name, its position): the seconds since the oldest entry the group has
    not acknowledged was added, by Redis's clock (an entry's id is the millisecond it was added);
    0 when it has none. The oldest pending entry (XPENDING's summary) when some are pending, as
    entries are delivered in order, else the first one after the last delivered. One pipeline,
    only for the groups with a backlog, and a read of Redis's clock."""
    waiting = [(i, stream, name, g) for i, (stream, name, g) in enumerate(groups) if g.backlog]
    ages = [0.0] * len(groups)
    if not waiting:
        return ages
    async with redis.pipeline(transaction=False) as pipe:
        for _, stream, name, group in waiting:
            if group.pending:
                pipe.xpending(stream, name)
            else:
                pipe.xrange(stream, min="(" + group.last_delivered, count=1)
        replies = await pipe.execute()
    now = await time_ms(redis, waiting[0][1])
    for (i, _, _, group), reply in zip(waiting, replies, strict=True):
        oldest = reply.get("min") if group.pending else (reply[0][0] if reply else None)
        if oldest:
            added = int(str(oldest).split("-", 1)[0])
            ages[i] = max(0, now - added) / 1000
    return ages


async def backlog(engine: RedisEngine, item_id: int) -> int:
    """Entries of the item's streams (one per stock shard) the persister has not landed yet
    (pending or never read)."""
    streams = [keys.events for keys in await engine.shard_keys(item_id)]
    return sum(stream.of(GROUP).backlog for stream in await read_progress(engine.redis, streams))


async def stream_drained(redis: RedisClient, stream: str) -> bool:
    """Has every consumer group of the stream received and acknowledged every entry?"""
    [progress] = await read_progress(redis, [stream])
    return progress.drained


async def refresh_stream_gauges(engine: RedisEngine) -> None:
    """Read length, pending and lag of every registered item's stream, every group's, into the
    stream gauges (for ``/metrics``, when scraped)."""
    shards = [keys for i in await engine.item_ids() for keys in await engine.shard_keys(i)]
    streams = await read_progress(engine.redis, [keys.events for keys in shards])
    positions = [
        (keys, name, group)
        for keys, stream in zip(shards, streams, strict=True)
        for name, group in stream.groups.items()
    ]
    ages = await oldest_ages(engine.redis, [(k.events, n, g) for k, n, g in positions])
    # Archived items' series go: what a scrape returns follows the live items, not history.
    gauges = (metrics.STREAM_LENGTH, metrics.STREAM_PENDING, metrics.STREAM_LAG)
    for gauge in (*gauges, metrics.STREAM_OLDEST_AGE):
        gauge.clear()
    for keys, stream in zip(shards, streams, strict=True):
        metrics.STREAM_LENGTH.labels(item=_item_label(keys)).set(stream.length)
    for (keys, name, group), age in zip(positions, ages, strict=True):
        item = _item_label(keys)
        metrics.STREAM_PENDING.labels(item=item, group=name).set(group.pending)
        metrics.STREAM_LAG.labels(item=item, group=name).set(group.lag)
        metrics.STREAM_OLDEST_AGE.labels(item=item, group=name).set(age)


def _item_label(keys: ItemKeys) -> str:
    """An item's label; a stock shard's stream is labelled "<item>:s<shard>"."""
    return str(keys.item_id) if keys.shard == 0 else f"{keys.item_id}:s{keys.shard}"
