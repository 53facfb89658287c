"""The persister: lands every item stream's events in SQL through the ledger.

One consumer group (``seckill.engine.streams.GROUP``) per item stream, found through the items
registry. Each pass reads a batch with XREADGROUP, lands it in one transaction, then XACKs, so
an entry is acknowledged only once it is in SQL. Several persister processes share the group
safely: the ledger makes every event idempotent and order-independent.

On one Redis a pass is one XREADGROUP over every stream, blocking while all are empty. A Redis
Cluster refuses a command over keys of several slots, so there a pass sends one XREADGROUP per
stream, all in one pipeline (one round trip per node), without BLOCK; a pass that found nothing
waits ``poll_ms``. The batch is shared out: streams that filled their share last pass split it,
the others are read one entry deep, which is enough to notice they have woken.

Failures, by kind:
- the database is unreachable: the batch is retried as it is (no delivery counted) until it
  lands or the worker is stopped; nothing is read meanwhile, so the backlog waits in Redis;
- an entry lands ahead of an earlier one still pending (a unit resold before its release
  landed): it waits, pending, and is claimed again with the earlier one, which lands first;
- an entry cannot land (undecodable, contradicting the record): the batch is split in halves
  until the bad entry stands alone, its neighbours land, and it stays pending; it comes back
  through XAUTOCLAIM once idle, and after ``max_deliveries`` it becomes a dead letter (a table
  row and an entry on the item's dead-letter stream) with its error;
- a crashed persister: its pending entries go idle and another persister claims them;
- Redis failed (a lost connection, a failover; on a cluster, a stream now served by another
  node): acknowledgements sent just before may not have reached the server that now answers, so
  the next read starts with this consumer's own pending entries (they land again, idempotently)
  instead of leaving them until they go idle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from seckill.domain.events import (
    AheadOfStream,
    BadEvent,
    EventKind,
    StockEvent,
    decode_event,
    stream_position,
)
from seckill.engine.cluster import REDIS_UNAVAILABLE, RedisClient
from seckill.engine.engine import ShardCounts, registered_items
from seckill.engine.keys import DEFAULT_PREFIX, ItemKeys, item_keys
from seckill.engine.streams import GROUP
from seckill.observability import metrics
from seckill.store.database import is_transient
from seckill.store.ledger import Ledger

log = logging.getLogger(__name__)

DISCOVER_EVERY_S = 1.0  # a newly warmed item's stream is followed within this time
_COMMITS = metrics.SQL_TRANSACTIONS.labels(result="commit")
_FAILURES = metrics.SQL_TRANSACTIONS.labels(result="failure")


@dataclass(frozen=True, slots=True, kw_only=True)
class PersisterConfig:
    batch_size: int = 500
    block_ms: int = 1_000
    # A Redis Cluster: the wait after a pass that found nothing new (BLOCK cannot span slots);
    # an order lands at most this much later once the streams have gone quiet.
    poll_ms: int = 50
    # After a part-full batch, wait this long before reading again, so that under load the next
    # batch gathers more: fewer, larger transactions (each costs a commit), an order lands at
    # most this much later.
    linger_ms: int = 20
    claim_idle_ms: int = 30_000  # an entry pending this long belongs to a dead consumer
    max_deliveries: int = 5
    trim_every_s: float = 5.0
    # A consumer with nothing pending and idle this long is forgotten (every process start adds
    # one); it loses nothing, and a live one is recreated by its next read.
    forget_consumer_idle_ms: int = 3_600_000
    retry_pause_s: float = 0.5  # first pause while the database is down (doubles, capped)
    # A batch that takes longer is treated as an outage (a silent network drop would otherwise
    # hang the persister until TCP gives up, minutes later).
    apply_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Entry:
    keys: ItemKeys
    entry_id: str
    fields: dict[str, str]


class Persister:
    name = "persister"

    def __init__(
        self,
        *,
        redis: RedisClient,
        ledger: Ledger,
        prefix: str = DEFAULT_PREFIX,
        consumer: str | None = None,
        config: PersisterConfig | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self._redis = redis
        self._ledger = ledger
        self._prefix = prefix
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.config = config or PersisterConfig()
        self._stop = stop or asyncio.Event()
        self._streams: dict[str, ItemKeys] = {}  # every item's shard streams, found by _discover
        self._shard_counts = ShardCounts(redis, prefix)
        self._full: set[str] = set()  # streams that filled their share of the last pass
        self._owners: dict[str, str] = {}  # on a cluster: the node serving each stream
        self._next_discover = 0.0
        self._next_claim = 0.0
        self._next_trim = 0.0
        self.landed = 0
        self.dead_lettered = 0
        self._own_pending_first = False

    async def run_once(self) -> int:
        """Claim idle entries, read new ones, land them; returns the entries acknowledged."""
        try:
            return await self._pass()
        except REDIS_UNAVAILABLE:
            self._own_pending_first = True
            raise
        except ResponseError as exc:
            if not str(exc).startswith("NOGROUP"):
                raise
            # Redis lost the stream or its group (restarted empty, FLUSHALL, an older AOF):
            # follow the streams afresh; `seckill recover` puts the items back.
            log.warning("a stream lost its consumer group (%s); rediscovering", exc)
            self._streams.clear()
            self._next_discover = 0.0
            return 0

    async def _pass(self) -> int:
        now = time.monotonic()
        if now >= self._next_discover:
            self._next_discover = now + DISCOVER_EVERY_S
            await self._discover()
        if not self._streams:
            self._next_discover = 0.0  # look again on the next pass
            await asyncio.sleep(self.config.block_ms / 1000)
            return 0
        done = 0
        if now >= self._next_claim:
            self._next_claim = now + max(self.config.claim_idle_ms / 2000, 0.05)
            done += await self._land(await self._claim_idle())
        fresh = await self._read(block=not done)
        done += await self._land(fresh)
        if now >= self._next_trim:
            self._next_trim = now + self.config.trim_every_s
            await self.trim()
        if 0 < len(fresh) < self.config.batch_size and self.config.linger_ms:
            await asyncio.sleep(self.config.linger_ms / 1000)
        return done

    # -- reading -------------------------------------------------------------------------------

    async def _discover(self) -> None:
        for item_id in await registered_items(self._redis, self._prefix):
            for shard in range(await self._shard_counts.of(item_id)):
                keys = item_keys(item_id, self._prefix, shard)
                if keys.events not in self._streams:
                    try:
                        await self._redis.xgroup_create(keys.events, GROUP, id="0", mkstream=True)
                    except ResponseError as exc:
                        if "BUSYGROUP" not in str(exc):
                            raise
                    self._streams[keys.events] = keys

    async def _read(self, *, block: bool) -> list[Entry]:
        if self._own_pending_first:
            return await self._read_own_pending()
        if isinstance(self._redis, RedisCluster):
            return await self._read_each_stream(self._redis, block=block)
        reply = cast(
            list[tuple[str, list[tuple[str, dict[str, str] | None]]]] | None,
            await self._redis.xreadgroup(
                GROUP,
                self.consumer,
                dict.fromkeys(self._streams, ">"),
                count=self.config.batch_size,
                block=self.config.block_ms if block else None,
            ),
        )
        return self._entries(reply or [])

    async def _read_each_stream(self, cluster: RedisCluster, *, block: bool) -> list[Entry]:
        if self._stream_moved(cluster):
            return await self._read_own_pending()
        counts = self._shares()
        read = await self._read_streams(counts, ">")
        self._full = {stream for stream, entries in read if len(entries) >= counts[stream]}
        entries = self._entries(read)
        if not entries and block:
            await asyncio.sleep(self.config.poll_ms / 1000)
        return entries

    async def _read_own_pending(self) -> list[Entry]:
        """Entries delivered to this consumer and not acknowledged (as the server now answering
        knows), up to a batch per stream: once, after Redis failed; the rest go idle and are
        claimed as a dead consumer's would be."""
        read = await self._read_streams(dict.fromkeys(self._streams, self.config.batch_size), "0")
        self._own_pending_first = False
        for stream, entries in read:
            await self._ack_deleted(stream, entries)
        return self._entries(read)

    async def _read_streams(
        self, counts: dict[str, int], start: str
    ) -> list[tuple[str, list[tuple[str, dict[str, str] | None]]]]:
        """One XREADGROUP per stream from ``start`` (">": new entries; "0": this consumer's
        pending ones), in one pipeline: a cluster refuses one over several slots."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream, count in counts.items():
                pipe.xreadgroup(GROUP, self.consumer, {stream: start}, count=count)
            replies = await pipe.execute()
        return [stream_reply for reply in replies if reply for stream_reply in reply]

    def _stream_moved(self, cluster: RedisCluster) -> bool:
        """Whether a stream is now served by another node than on the last pass (a failover,
        or its slot moved), as the cluster client's slot map says."""
        owners = {}
        for stream in self._streams:
            node = cluster.get_node_from_key(stream)
            owners[stream] = node.name if node else ""
        moved = any(owners[s] != self._owners.get(s, owners[s]) for s in owners)
        self._owners = owners
        return moved

    def _shares(self) -> dict[str, int]:
        """How many entries to read from each stream this pass: about ``batch_size`` in all."""
        full = self._full & self._streams.keys()
        if not full:  # none known busy: an equal share each
            return dict.fromkeys(
                self._streams, max(1, self.config.batch_size // len(self._streams))
            )
        quiet = len(self._streams) - len(full)
        share = max(1, (self.config.batch_size - quiet) // len(full))
        return {stream: share if stream in full else 1 for stream in self._streams}

    def _entries(
        self, reply: Sequence[tuple[str, list[tuple[str, dict[str, str] | None]]]]
    ) -> list[Entry]:
        return [
            Entry(self._streams[stream], entry_id, fields)
            for stream, entries in reply
            for entry_id, fields in entries
            if fields is not None
        ]

    async def _claim_idle(self) -> list[Entry]:
        claimed: list[Entry] = []
        for stream, keys in self._streams.items():
            reply = await self._redis.xautoclaim(
                stream,
                GROUP,
                self.consumer,
                min_idle_time=self.config.claim_idle_ms,
                start_id="0-0",
                count=self.config.batch_size,
            )
            await self._ack_deleted(stream, reply[1])
            claimed += [Entry(keys, entry_id, fields) for entry_id, fields in reply[1] if fields]
        return claimed

    async def _ack_deleted(
        self, stream: str, entries: Sequence[tuple[str, dict[str, str] | None]]
    ) -> None:
        """Acknowledge the pending entries deleted from the stream meanwhile: nothing to land."""
        gone = [entry_id for entry_id, fields in entries if fields is None]
        if gone:
            await self._redis.xack(stream, GROUP, *gone)

    # -- landing -------------------------------------------------------------------------------

    async def _land(self, entries: list[Entry]) -> int:
        if not entries:
            return 0
        decoded: list[tuple[Entry, StockEvent]] = []
        for entry in entries:
            try:
                decoded.append(
                    (entry, decode_event(entry.entry_id, entry.fields, shard=entry.keys.shard))
                )
            except BadEvent as exc:
                await self._failed(entry, str(exc))
        landed = await self._apply(decoded)
        await self._ack(landed)
        self.landed += len(landed)
        if landed:
            metrics.PERSISTER_BATCH_SIZE.observe(len(landed))
            metrics.PERSISTER_ROWS.inc(len(landed))
        _log_new_orders(decoded, landed)
        return len(landed)

    async def _apply(self, batch: Sequence[tuple[Entry, StockEvent]]) -> list[Entry]:
        """Land what can land; returns those entries. Splits around entries that cannot."""
        if not batch:
            return []
        pause = self.config.retry_pause_s
        while True:
            try:
                async with asyncio.timeout(self.config.apply_timeout_s):
                    await self._ledger.apply([event for _, event in batch])
                _COMMITS.inc()
                return [entry for entry, _ in batch]
            except Exception as exc:
                _FAILURES.inc()
                if is_transient(exc):
                    if self._stop.is_set():
                        log.warning("stopping with the database unavailable; %d entries stay "
                                    "pending for another persister", len(batch))  # fmt: skip
                        return []
                    log.warning("database unavailable (%s); retrying in %.1f s", exc, pause)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 5.0)
                    continue
                if len(batch) == 1:
                    entry = batch[0][0]
                    if isinstance(exc, AheadOfStream) and await self._older_pending(entry):
                        # The release that freed this stock is pending elsewhere: once claimed
                        # it lands first, and this entry after it. Not the entry's fault.
                        log.info("entry %s waits for earlier entries: %s", entry.entry_id, exc)
                        return []
                    await self._failed(entry, f"{type(exc).__name__}: {exc}")
                    return []
                half = len(batch) // 2
                return await self._apply(batch[:half]) + await self._apply(batch[half:])

    async def _failed(self, entry: Entry, error: str) -> None:
        """An entry that cannot land: dead-letter it once delivered often enough, else wait."""
        deliveries = await self._deliveries(entry)
        if deliveries < self.config.max_deliveries:
            log.warning(
                "entry %s of %s failed (delivery %d of %d): %s",
                entry.entry_id, entry.keys.events, deliveries, self.config.max_deliveries, error,
            )  # fmt: skip
            return
        await self._ledger.add_dead_letter(
            stream=entry.keys.events,
            entry_id=entry.entry_id,
            payload=entry.fields,
            error=error,
            deliveries=deliveries,
        )
        dead: dict[Any, Any] = {
            **entry.fields,
            "dead_entry_id": entry.entry_id,
            "dead_error": error[:1000],
        }
        await self._redis.xadd(entry.keys.dead_letters, dead)
        await self._redis.xack(entry.keys.events, GROUP, entry.entry_id)
        self.dead_lettered += 1
        metrics.DEAD_LETTERS.inc()
        log.error("entry %s of %s is a dead letter: %s", entry.entry_id, entry.keys.events, error)

    async def _older_pending(self, entry: Entry) -> bool:
        """Is an earlier entry of the stream delivered but not yet landed (any consumer)?"""
        ms, seq = stream_position(entry.entry_id)
        before = f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"
        older = await self._redis.xpending_range(
            entry.keys.events, GROUP, min="-", max=before, count=1
        )
        return bool(older)

    async def _deliveries(self, entry: Entry) -> int:
        pending = await self._redis.xpending_range(
            entry.keys.events, GROUP, min=entry.entry_id, max=entry.entry_id, count=1
        )
        return int(pending[0]["times_delivered"]) if pending else 1

    async def _ack(self, entries: list[Entry]) -> None:
        by_stream: dict[str, list[str]] = defaultdict(list)
        for entry in entries:
            by_stream[entry.keys.events].append(entry.entry_id)
        for stream, ids in by_stream.items():
            await self._redis.xack(stream, GROUP, *ids)

    # -- bounded memory ------------------------------------------------------------------------

    async def trim(self) -> None:
        """Drop stream entries that every consumer group has acknowledged, and consumers gone
        quiet with nothing pending."""
        for stream in self._streams:
            safe = await self._acknowledged_below(stream)
            if safe is not None:
                await self._redis.xtrim(stream, minid=safe)
            consumers: list[dict[str, Any]] = await self._redis.xinfo_consumers(stream, GROUP)
            for consumer in consumers:
                if (
                    consumer["pending"] == 0
                    and consumer["idle"] >= self.config.forget_consumer_idle_ms
                    and consumer["name"] != self.consumer
                ):
                    await self._redis.xgroup_delconsumer(stream, GROUP, consumer["name"])

    async def _acknowledged_below(self, stream: str) -> str | None:
        """The lowest entry id some group still needs; everything below it is done with."""
        groups: list[dict[str, Any]] = await self._redis.xinfo_groups(stream)
        if not groups:
            return None
        needed: list[str] = []
        for group in groups:
            # Another persister may acknowledge in between: no pending entry left is fine.
            summary = await self._redis.xpending(stream, group["name"]) if group["pending"] else {}
            if summary.get("min"):
                needed.append(summary["min"])
            else:
                ms, seq = stream_position(group["last-delivered-id"])
                needed.append(f"{ms}-{seq + 1}")
        return min(needed, key=stream_position)


def _log_new_orders(decoded: Sequence[tuple[Entry, StockEvent]], landed: list[Entry]) -> None:
    """One line per order landed, with the request id that reserved it: the end of its trace
    (bounded by the stock, like the API's line for the reservation)."""
    if not log.isEnabledFor(logging.INFO):
        return
    ids = {entry.entry_id for entry in landed}
    for entry, event in decoded:
        if event.kind is EventKind.RESERVED and entry.entry_id in ids:
            log.info(
                "order %d landed in SQL",
                event.order_id,
                extra={
                    "request_id": event.request_id or "",
                    "order_id": event.order_id,
                    "item_id": event.item_id,
                },
            )
