"""Reading every item stream through one consumer group: the Redis side of each sink's worker
(the persister lands entries in SQL, a bridge forwards them to a broker;
``seckill.workers.consumer`` is what they share above it).

The streams are found through the items registry (each stock shard has its own). Every reader
registers its group in the groups registry (``seckill.engine.group_registry``), and makes every
registered group on each stream it finds, from the stream's first entry: a reader that finds a
new stream first (the persister, say) makes the others' groups too, so its trimming never takes
an entry from under a group that has not found the stream yet (a bridge between two looks at the
registry). A group registered later sees the whole stream that is left. A worker acknowledges an
entry only once its sink has it; the group remembers what is pending.

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

Trimming (``seckill.engine.trimming``) drops only what every group of a stream has
acknowledged. A stream's trim point moves when a group acknowledges, so each reader trims the
streams it acknowledged entries of since its last trim (the group that acknowledges last is the
one whose trim frees them); at start and every ``sweep_every_s`` it trims every stream, and
forgets its group's quiet consumers, in case another reader's trim was lost (it stopped first)
or a group went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster

from seckill.domain.events import stream_position
from seckill.engine.base import ShardCounts, registered_items
from seckill.engine.cluster import RedisClient
from seckill.engine.group_registry import create_group
from seckill.engine.keys import ItemKeys, encoded, item_keys, stream_groups_registry
from seckill.engine.trimming import trim_streams

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
        and the pass in hand reads nothing further (see
        ``seckill.workers.consumer.one_pass``)."""
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
                    await create_group(self._redis, keys.events, group)
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
                {encoded(stream): ">" for stream in self.streams},
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

    async def still_there(self, entries: Sequence[Entry]) -> list[bool]:
        """Whether each entry is still on its stream: Redis may have lost some since they were
        read (a restart from an older AOF, a lagging replica promoted). One pipelined read."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                pipe.xrange(entry.keys.events, entry.entry_id, entry.entry_id, count=1)
            found = await pipe.execute()
        return [bool(hit) for hit in found]

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
