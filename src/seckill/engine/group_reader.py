"""Reading every item stream through one consumer group: what each sink's worker shares (the
persister lands entries in SQL, the bridge forwards them to a broker).

The streams are found through the items registry (each stock shard has its own). Every reader
registers its group in the groups registry, and makes every registered group on each stream it
finds, from the stream's first entry: a reader that finds a new stream first (the persister, say)
makes the others' groups too, so its trimming never takes an entry from under a group that has
not found the stream yet (a bridge between two looks at the registry). A group registered later
sees the whole stream that is left. A worker acknowledges an entry only once its sink has it;
the group remembers what is pending. A group taken out of service leaves the registry and every
stream through ``retire_group`` (``seckill groups retire``), or the streams keep everything.
The registry dies with Redis: SQL keeps a durable copy (``services/stream_groups.py``), and a
recovery puts it back with ``register_groups``, each group on the streams it rebuilds, before it
gives them their events back.

On one Redis a read is one XREADGROUP over every stream, blocking while all are empty. A Redis
Cluster refuses a command over keys of several slots, so there a read sends one XREADGROUP per
stream, all in one pipeline (one round trip per node), without BLOCK; a read that found nothing
waits ``poll_ms``. The batch is shared out: streams that filled their share last time split it,
the others are read one entry deep, which is enough to notice they have woken.

Entries pending with a consumer that went quiet for ``claim_idle_ms`` (it crashed) are claimed,
one XAUTOCLAIM per stream, all in one pipeline. After Redis failed (a lost connection, a
failover; on a cluster, a stream now served by another node), acknowledgements sent just before
may not have reached the server that now answers, so the next read starts with this consumer's
own pending entries instead of leaving them until they go idle.

Trimming drops only what every group of a stream has acknowledged. A stream's trim point moves
when a group acknowledges, so each reader trims the streams it acknowledged entries of since its
last trim (the group that acknowledges last is the one whose trim frees them); at start and every
``sweep_every_s`` it trims every stream, and forgets its group's quiet consumers, in case another
reader's trim was lost (it stopped first) or a group went away. Each trim reads and writes in
pipelines, a few round trips in all however many streams it touches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from seckill.domain.events import stream_position
from seckill.engine.base import ShardCounts, registered_items
from seckill.engine.cluster import REDIS_UNAVAILABLE, RedisClient
from seckill.engine.keys import ItemKeys, item_keys, stream_groups_registry

log = logging.getLogger(__name__)

DISCOVER_EVERY_S = 1.0  # a newly warmed item's stream is followed within this time

StreamReply = list[tuple[str, list[tuple[str, dict[str, str] | None]]]]


@dataclass(frozen=True, slots=True)
class Entry:
    keys: ItemKeys  # of the stock shard whose stream holds it
    entry_id: str
    fields: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadConfig:
    batch_size: int = 500
    block_ms: int = 1_000
    # A Redis Cluster: the wait after a read that found nothing new (BLOCK cannot span slots);
    # an entry reaches its sink at most this much later once the streams have gone quiet.
    poll_ms: int = 50
    claim_idle_ms: int = 30_000  # an entry pending this long belongs to a dead consumer
    trim_every_s: float = 5.0  # the streams acknowledged in since the last trim
    sweep_every_s: float = 600.0  # every stream (and at start): see the module's docstring
    # A consumer with nothing pending and idle this long is forgotten (every process start adds
    # one); it loses nothing, and a live one is recreated by its next read.
    forget_consumer_idle_ms: int = 3_600_000


# The longest pause between two tries of something failing (a sink down, a pass that raised):
# long enough not to hammer what is down, short enough to notice it is back.
RETRY_PAUSE_MAX_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig(ReadConfig):
    """How a consumer of the streams (the persister, a bridge) reads and retries."""

    max_deliveries: int = 5  # an entry its sink refused this often is a dead letter
    retry_pause_s: float = 0.5  # the first pause while its sink is down (doubles, capped)
    retry_pause_max_s: float = RETRY_PAUSE_MAX_S


class GroupReader:
    """One consumer of ``group`` on every item stream."""

    def __init__(
        self, *, redis: RedisClient, group: str, consumer: str, prefix: str, config: ReadConfig
    ) -> None:
        self._redis = redis
        self.group = group
        self.consumer = consumer
        self._prefix = prefix
        self.config = config
        self.streams: dict[str, ItemKeys] = {}  # every item's shard streams, found by discover
        self._shard_counts = ShardCounts(redis, prefix)
        self._full: set[str] = set()  # streams that filled their share of the last read
        self._owners: dict[str, str] = {}  # on a cluster: the node serving each stream
        self._next_discover = 0.0
        self._next_claim = 0.0
        self._next_trim = 0.0
        self._next_sweep = 0.0
        self._acknowledged: set[str] = set()  # streams acknowledged in since the last trim
        self._own_pending_first = False
        self.more_waiting = False  # the last read filled its count: a backlog, read on at once

    def redis_failed(self) -> None:
        """Redis failed under a read or an acknowledgement: read this consumer's pending
        entries first next time."""
        self._own_pending_first = True

    def read_pending_next(self) -> None:
        """Entries left pending on purpose (the sink may not take them yet): the next read
        starts with this consumer's pending entries, from Redis (one it lost is gone from them),
        and the pass in hand reads nothing further (see ``one_pass``)."""
        self._own_pending_first = True

    @property
    def pending_next(self) -> bool:
        """Whether the next read is this consumer's pending entries."""
        return self._own_pending_first

    async def abandon(self, read: asyncio.Future[Any]) -> None:
        """A read started ahead whose entries will not be handled now (the lot before it failed
        or stalled): what it took is pending with this consumer, so the next read starts there,
        from Redis."""
        read.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await read
        self._own_pending_first = True

    def forget_streams(self) -> None:
        """A stream lost its group (Redis restarted empty, FLUSHALL, an older AOF, its item
        archived): follow the streams afresh. On a cluster the other streams' reads in the same
        pipeline went through, so their entries wait, pending with this consumer: read first."""
        self.streams.clear()
        self._next_discover = 0.0
        self._own_pending_first = True

    async def upkeep(self) -> list[Entry]:
        """What is due: follow new streams (every ``DISCOVER_EVERY_S``), claim entries idle
        with a dead consumer (every half ``claim_idle_ms``); returns the claimed entries."""
        now = time.monotonic()
        if now >= self._next_discover:
            self._next_discover = now + DISCOVER_EVERY_S
            await self.discover()
        if not self.streams:
            self._next_discover = 0.0  # look again next time
            return []
        if now < self._next_claim:
            return []
        self._next_claim = now + max(self.config.claim_idle_ms / 2000, 0.05)
        return await self.claim_idle()

    async def discover(self) -> None:
        """Follow the streams of every item in the registry, and let go of those whose item
        left it (archived). Each registered group (this one among them) is made on a stream
        this reader had not followed yet, with the stream if there is none: an item is
        registered before it is loaded, so the groups of every reader registered by then are
        there before anything can trim what they have not read."""
        registry = stream_groups_registry(self._prefix)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.sadd(registry, self.group)  # again each time: Redis may have come back empty
            pipe.smembers(registry)
            _, groups = await pipe.execute()
        registered: set[str] = set()
        for item_id in await registered_items(self._redis, self._prefix):
            for shard in range(await self._shard_counts.of(item_id)):
                keys = item_keys(item_id, self._prefix, shard)
                registered.add(keys.events)
                if keys.events in self.streams:
                    continue
                for group in sorted(groups):
                    await _create_group(self._redis, keys.events, group)
                self.streams[keys.events] = keys
        for stream in self.streams.keys() - registered:
            del self.streams[stream]

    async def read(self, *, block: bool) -> list[Entry]:
        """New entries, up to about a batch (this consumer's pending ones after Redis failed)."""
        self.more_waiting = False
        if self._own_pending_first:
            return await self._read_own_pending()
        if isinstance(self._redis, RedisCluster):
            return await self._read_each_stream(self._redis, block=block)
        reply = cast(
            StreamReply | None,
            await self._redis.xreadgroup(
                self.group,
                self.consumer,
                dict.fromkeys(self.streams, ">"),
                count=self.config.batch_size,
                block=self.config.block_ms if block else None,
            ),
        )
        # COUNT is per stream: one that gave all it was asked has more.
        self.more_waiting = any(
            len(entries) >= self.config.batch_size for _, entries in reply or []
        )
        return self._entries(reply or [])

    async def _read_each_stream(self, cluster: RedisCluster, *, block: bool) -> list[Entry]:
        if self._stream_moved(cluster):
            return await self._read_own_pending()
        counts = self._shares()
        read = await self._read_streams({stream: (">", n) for stream, n in counts.items()})
        self._full = {stream for stream, entries in read if len(entries) >= counts[stream]}
        self.more_waiting = bool(self._full)
        entries = self._entries(read)
        if not entries and block:
            await asyncio.sleep(self.config.poll_ms / 1000)
        return entries

    async def _read_own_pending(self) -> list[Entry]:
        """Every entry delivered to this consumer and not acknowledged (as the server now
        answering knows): once, after Redis failed or when a worker starts again under the
        same name, before anything new."""
        batch = self.config.batch_size
        found: StreamReply = []
        reads = dict.fromkeys(self.streams, ("0", batch))
        while reads:
            read = await self._read_streams(reads)
            reads = {}
            for stream, entries in read:
                await self._ack_deleted(stream, entries)
                found.append((stream, entries))
                if len(entries) >= batch:  # maybe more: read on from there
                    reads[stream] = (entries[-1][0], batch)
        self._own_pending_first = False
        return self._entries(found)

    async def _read_streams(self, reads: dict[str, tuple[str, int]]) -> StreamReply:
        """One XREADGROUP per stream, from its start (">": new entries; an id: this consumer's
        pending entries after it) for up to its count, in one pipeline: a cluster refuses one
        over several slots."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream, (start, count) in reads.items():
                pipe.xreadgroup(self.group, self.consumer, {stream: start}, count=count)
            replies = await pipe.execute()
        return [stream_reply for reply in replies if reply for stream_reply in reply]

    def _stream_moved(self, cluster: RedisCluster) -> bool:
        """Whether a stream is now served by another node than on the last read (a failover,
        or its slot moved), as the cluster client's slot map says."""
        owners = {}
        for stream in self.streams:
            node = cluster.get_node_from_key(stream)
            owners[stream] = node.name if node else ""
        moved = any(owners[s] != self._owners.get(s, owners[s]) for s in owners)
        self._owners = owners
        return moved

    def _shares(self) -> dict[str, int]:
        """How many entries to read from each stream this time: about ``batch_size`` in all."""
        full = self._full & self.streams.keys()
        if not full:  # none known busy: an equal share each
            return dict.fromkeys(self.streams, max(1, self.config.batch_size // len(self.streams)))
        quiet = len(self.streams) - len(full)
        share = max(1, (self.config.batch_size - quiet) // len(full))
        return {stream: share if stream in full else 1 for stream in self.streams}

    def _entries(self, reply: StreamReply) -> list[Entry]:
        return [
            Entry(self.streams[stream], entry_id, fields)
            for stream, entries in reply
            for entry_id, fields in entries
            if fields  # a deleted entry has none (see _ack_deleted)
        ]

    async def claim_idle(self) -> list[Entry]:
        """Entries pending with a consumer quiet for ``claim_idle_ms``, now this one's: one
        XAUTOCLAIM per stream (up to a batch each), all in one pipeline."""
        streams = list(self.streams)
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    min_idle_time=self.config.claim_idle_ms,
                    start_id="0-0",
                    count=self.config.batch_size,
                )
            replies = await pipe.execute()
        claimed: list[Entry] = []
        for stream, reply in zip(streams, replies, strict=True):
            await self._ack_deleted(stream, reply[1])
            keys = self.streams[stream]
            claimed += [Entry(keys, entry_id, fields) for entry_id, fields in reply[1] if fields]
        return claimed

    async def _ack_deleted(
        self, stream: str, entries: Sequence[tuple[str, dict[str, str] | None]]
    ) -> None:
        """Acknowledge the pending entries deleted from the stream meanwhile: nothing to do.
        A deleted entry comes back without fields (Redis sends nil, which redis-py makes an
        empty dict); an entry that is there has at least one."""
        gone = [entry_id for entry_id, fields in entries if not fields]
        if gone:
            await self._redis.xack(stream, self.group, *gone)
            self._acknowledged.add(stream)

    async def ack(self, entries: Sequence[Entry]) -> None:
        """Done with these: their sink has them."""
        by_stream: dict[str, list[str]] = defaultdict(list)
        for entry in entries:
            by_stream[entry.keys.events].append(entry.entry_id)
        for stream, ids in by_stream.items():
            await self._redis.xack(stream, self.group, *ids)
            self._acknowledged.add(stream)

    async def deliveries(self, entry: Entry) -> int:
        """How many times the entry was delivered to this group."""
        pending = await self._redis.xpending_range(
            entry.keys.events, self.group, min=entry.entry_id, max=entry.entry_id, count=1
        )
        return int(pending[0]["times_delivered"]) if pending else 1

    async def older_pending(self, entry: Entry) -> bool:
        """Is an earlier entry of the stream delivered but not yet acknowledged (any consumer)?"""
        ms, seq = stream_position(entry.entry_id)
        before = f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"
        older = await self._redis.xpending_range(
            entry.keys.events, self.group, min="-", max=before, count=1
        )
        return bool(older)

    # -- bounded memory ------------------------------------------------------------------------

    async def trim_if_due(self) -> None:
        """Every ``trim_every_s``, trim the streams acknowledged in since the last trim; at
        start and every ``sweep_every_s``, every stream (see ``trim``)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self.config.sweep_every_s
            self._next_trim = now + self.config.trim_every_s
            await self.trim()
        elif now >= self._next_trim:
            self._next_trim = now + self.config.trim_every_s
            acknowledged = self._acknowledged & self.streams.keys()
            self._acknowledged = set()
            await trim_streams(self._redis, sorted(acknowledged))

    async def trim(self) -> None:
        """Drop the entries of every stream that every consumer group has acknowledged, and
        this group's consumers gone quiet with nothing pending."""
        streams = list(self.streams)
        self._acknowledged = set()
        await trim_streams(self._redis, streams)
        await self._forget_quiet_consumers(streams)

    async def _forget_quiet_consumers(self, streams: Sequence[str]) -> None:
        """This group's consumers idle ``forget_consumer_idle_ms`` with nothing pending: every
        process start adds one, which loses nothing, and a live one is recreated by its next
        read. Two pipelines."""
        if not streams:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xinfo_consumers(stream, self.group)
            replies = await pipe.execute(raise_on_error=False)
        quiet = [
            (stream, consumer["name"])
            for stream, consumers in zip(streams, replies, strict=True)
            if not isinstance(consumers, Exception)  # no stream or group (yet): no consumer
            for consumer in cast(list[dict[str, Any]], consumers)
            if consumer["pending"] == 0
            and consumer["idle"] >= self.config.forget_consumer_idle_ms
            and consumer["name"] != self.consumer
        ]
        if quiet:
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, name in quiet:
                    pipe.xgroup_delconsumer(stream, self.group, name)
                await pipe.execute()


async def _create_group(redis: RedisClient, stream: str, group: str) -> None:
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
            await _create_group(redis, stream, group)


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


Lot = TypeVar("Lot")
Prepare = Callable[[list[Entry]], Lot]
"""What a consumer makes of entries as soon as they are read, before its sink is free (the
persister decodes them): work done while the lot before them is still with the sink."""
Handle = Callable[[Lot], Awaitable[int]]
"""What a consumer does with a prepared lot: hands it to its sink, acknowledges what the sink has
(and dead-letters what it never will), and returns how many entries it is done with."""


def as_read(entries: list[Entry]) -> list[Entry]:
    """The ``Prepare`` of a consumer that handles entries as they were read."""
    return entries


# How long one pass goes on handling a backlog lot after lot before its upkeep (claims,
# discovery, trims) is due again; a sink that took longer over one lot stalled (see one_pass).
BACKLOG_PASS_S = 1.0


async def one_pass(
    reader: GroupReader,
    handle: Handle[Lot],
    *,
    prepare: Prepare[Lot],
    linger_s: float = 0.0,
) -> int:
    """One pass of a worker that reads through ``reader`` (the persister, a bridge): claim a
    dead consumer's entries and handle them, read new ones and handle them, trim when due;
    returns the entries done. ``linger_s``: after a part-full read, wait this long so that under
    load the next lot gathers more.

    Through a backlog the pass reads ahead: while the sink takes one lot, the next is read and
    prepared, in the time the sink's server works, for up to ``BACKLOG_PASS_S``. A lot is
    handled only after the one before it, so a stream's entries still land in order. A lot read
    ahead while the sink stalled (an outage) is not handled: Redis may have lost entries since,
    so the next read takes this consumer's pending entries again from Redis.

    A lot that leaves entries pending on purpose (``GroupReader.read_pending_next``: a bridge
    whose events SQL has not landed yet) ends the pass: the lot read ahead is not handled, and
    the next read starts with the pending entries, so nothing newer of their streams goes first.

    When Redis fails under it, the next read starts with the consumer's own pending entries;
    when a stream lost its group (Redis restarted empty, FLUSHALL, an older AOF; ``seckill
    recover`` puts the items back), the streams are followed afresh (an archived item's among
    them)."""

    async def read(*, block: bool) -> tuple[int, Lot]:
        entries = await reader.read(block=block)
        return len(entries), prepare(entries)

    try:
        claimed = await reader.upkeep()
        if not reader.streams:
            await asyncio.sleep(reader.config.block_ms / 1000)
            return 0
        done = await handle(prepare(claimed))
        count, lot = await read(block=not done)
        until = time.monotonic() + BACKLOG_PASS_S
        while True:
            ahead = None
            if reader.more_waiting and time.monotonic() < until:
                ahead = asyncio.ensure_future(read(block=False))
            handed = time.monotonic()
            try:
                done += await handle(lot)
            except BaseException:
                if ahead is not None:
                    await reader.abandon(ahead)
                raise
            if ahead is None:
                break
            if reader.pending_next:  # the lot left entries pending: none after them goes first
                await reader.abandon(ahead)
                break
            if time.monotonic() - handed > BACKLOG_PASS_S:  # the sink stalled
                await reader.abandon(ahead)
                break
            count, lot = await ahead
        await reader.trim_if_due()
        if linger_s and 0 < count < reader.config.batch_size:
            await asyncio.sleep(linger_s)
        return done
    except REDIS_UNAVAILABLE:
        reader.redis_failed()
        raise
    except ResponseError as exc:
        # NOGROUP alone, or inside a cluster pipeline's "Command # n (...) of pipeline caused
        # error"; UNBLOCKED: a read blocked on a stream that was deleted (Redis 7).
        if "NOGROUP" not in str(exc) and not str(exc).startswith("UNBLOCKED"):
            raise
        log.warning("%s: a stream lost its consumer group (%s); rediscovering", reader.group, exc)
        reader.forget_streams()
        return 0


async def acknowledged_below(redis: RedisClient, stream: str) -> str | None:
    """The lowest entry id some group of the stream still needs (pending, or not delivered
    yet); everything below it is done with. None: the stream has no group."""
    [below] = await acknowledged_below_each(redis, [stream])
    return below


async def acknowledged_below_each(redis: RedisClient, streams: Sequence[str]) -> list[str | None]:
    """``acknowledged_below`` of each stream, in order: two pipelines (XINFO GROUPS of each,
    then XPENDING of each group with entries pending). None: no such stream, or no group."""
    if not streams:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)
    groups_of: list[list[dict[str, Any]]] = []
    for reply in replies:
        if isinstance(reply, ResponseError):  # no such stream: nothing to trim
            reply = []
        elif isinstance(reply, Exception):
            raise reply
        groups_of.append(cast(list[dict[str, Any]], reply))
    pending = [
        (stream, group["name"])
        for stream, groups in zip(streams, groups_of, strict=True)
        for group in groups
        if group["pending"]
    ]
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    if pending:
        async with redis.pipeline(transaction=False) as pipe:
            for stream, name in pending:
                pipe.xpending(stream, name)
            summaries = dict(zip(pending, await pipe.execute(), strict=True))
    below: list[str | None] = []
    for stream, groups in zip(streams, groups_of, strict=True):
        needed: list[str] = []
        for group in groups:
            # Another consumer may acknowledge in between: no pending entry left is fine.
            summary = summaries.get((stream, group["name"])) or {}
            if summary.get("min"):
                needed.append(summary["min"])
            else:
                ms, seq = stream_position(group["last-delivered-id"])
                needed.append(f"{ms}-{seq + 1}")
        below.append(min(needed, key=stream_position) if needed else None)
    return below


async def trim_streams(redis: RedisClient, streams: Sequence[str]) -> None:
    """Drop the entries of each stream that every group of it has acknowledged (one XTRIM
    each, in one pipeline, after ``acknowledged_below_each``)."""
    trims = [
        (stream, below)
        for stream, below in zip(
            streams, await acknowledged_below_each(redis, streams), strict=True
        )
        if below is not None
    ]
    if trims:
        async with redis.pipeline(transaction=False) as pipe:
            for stream, below in trims:
                pipe.xtrim(stream, minid=below)
            await pipe.execute()
