"""The reaper: releases holds past their deadline, so unpaid stock goes back on sale.

Its work follows what is due, not how many items are on sale. Each pass reads the items registry
and, on each Redis node (one Redis is one node), that node's clock (the engine's, when it has
one), then in one round trip per node:

1. **asks which streams changed**: for every shard it is not already due to look at, whether
   its stream has an entry after the one its last look read (one XREAD on one Redis);
2. **looks** at the shards that are due: new to this reaper, changed, sharded, or whose next
   look has come. A look reads the shard's newest stream id, hold time and earliest deadline
   (and, on a sharded item, its earliest transfer in transit);
3. **releases** the holds past their deadline by ``expire_due``, until nothing is due, and on a
   sharded item delivers the transfers left in transit by a sender that stopped between the
   two halves.

Why a shard need not be looked at again before its next look, at the earliest of: its earliest
deadline, the look's time plus its hold time, and the look's time plus ``revisit_s``. Every hold
there at the look is due no earlier than the earliest deadline. A hold made after it is due no
earlier than its making plus the hold time it was made with; reserve.lua appends to the stream
in the same step, and so does every script that changes the hold time (load_item.lua) or puts
holds back (recover.lua), so a shard whose stream has a newer entry is looked at on the next
pass, within one interval. ``revisit_s`` bounds what no script does (a Redis restored from an
older file, a deadline index edited or recounted by hand).

The scripts decide with Redis's clock (or the engine's) and move each hold once (held ->
released is a compare-and-set inside them), so any number of reapers may run side by side: they
only share the work. A node that does not answer (a cluster's master failing over) does not stop
the pass: the shards on the other nodes are reaped at the usual pace, and the pass fails (and the
loop backs off) only when no node answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster

from seckill.engine.cluster import REDIS_UNAVAILABLE, time_ms
from seckill.engine.due import changed_streams, look, node_names
from seckill.engine.engine import TRANSIT_GRACE_MS, RedisEngine
from seckill.engine.keys import ItemKeys
from seckill.observability import metrics

log = logging.getLogger(__name__)

REVISIT_S = 10.0


@dataclass(frozen=True, slots=True)
class _Seen:
    """A shard's last look: its stream's newest id then, when to look again (ms, on the clock
    of ``node``), and the node that answered."""

    last_id: str
    next_look_ms: int
    node: str


class Reaper:
    name = "reaper"

    def __init__(
        self, *, engine: RedisEngine, batch: int = 500, revisit_s: float = REVISIT_S
    ) -> None:
        self._engine = engine
        self._batch = batch
        self._revisit_ms = int(revisit_s * 1000)
        self._seen: dict[str, _Seen] = {}  # by the shard's stream
        # The registry as last read, and its shards by node and sharded streams (on one Redis).
        self._layout: tuple[list[int], dict[str, list[ItemKeys]], set[str]] | None = None
        self.released = 0
        self.looked = 0  # shard looks made by this process (each a few reads in a pipeline)

    async def run_once(self) -> int:
        """Release every hold due now, in every item and shard; returns how many."""
        by_node, sharded = await self._shards_by_node()
        outcomes = await asyncio.gather(
            *(self._reap_node(node, shards, sharded) for node, shards in by_node.items()),
            return_exceptions=True,
        )
        released = 0
        unanswered: dict[str, BaseException] = {}
        for node, outcome in zip(by_node, outcomes, strict=True):
            if isinstance(outcome, REDIS_UNAVAILABLE):
                unanswered[node] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                released += outcome
        self.released += released
        metrics.REAPER_RELEASES.inc(released)
        if unanswered:
            first = next(iter(unanswered.values()))
            if len(unanswered) == len(by_node):
                raise first
            items = sorted({k.item_id for node in unanswered for k in by_node[node]})
            log.warning("reaper: Redis did not answer for items %s: %s", items, first)
        metrics.REAPER_LAST_PASS.set(time.time())
        return released

    async def _shards_by_node(self) -> tuple[dict[str, list[ItemKeys]], set[str]]:
        """Every registered item's shards by the node serving them, and the streams of sharded
        items' shards. On one Redis these follow from the registry alone once every item's
        shard count is known (it never changes once loaded), so they are kept while the
        registry reads the same; a cluster's slots move, so there they are made each pass."""
        engine = self._engine
        item_ids = await engine.item_ids()
        if self._layout is not None and self._layout[0] == item_ids:
            return self._layout[1], self._layout[2]
        by_node: dict[str, list[ItemKeys]] = defaultdict(list)
        sharded: set[str] = set()
        node_of = node_names(engine.redis)
        for item_id in item_ids:
            shards = await engine.shard_keys(item_id)
            for keys in shards:
                by_node[node_of(keys.item)].append(keys)
            if len(shards) > 1:
                sharded.update(keys.events for keys in shards)
        followed = {keys.events for shards in by_node.values() for keys in shards}
        self._seen = {s: seen for s, seen in self._seen.items() if s in followed}
        lasting = not isinstance(engine.redis, RedisCluster) and all(
            engine.shard_count_known(item_id) for item_id in item_ids
        )
        self._layout = (item_ids, by_node, sharded) if lasting else None
        return by_node, sharded

    async def _reap_node(self, node: str, shards: list[ItemKeys], sharded: Collection[str]) -> int:
        """One node's part of a pass: which shards to look at, the looks, the releases."""
        redis = self._engine.redis
        now_arg = self._engine.now_arg()
        now = int(now_arg) if now_arg else await time_ms(redis, shards[0].item)
        due: list[ItemKeys] = []
        quiet: dict[str, ItemKeys] = {}
        since: dict[str, str] = {}
        for keys in shards:
            last = self._seen.get(keys.events)
            if (
                last is None
                or last.node != node
                or now >= last.next_look_ms
                or keys.events in sharded
            ):
                due.append(keys)
            else:
                quiet[keys.events] = keys
                since[keys.events] = last.last_id
        due += [quiet[stream] for stream in await changed_streams(redis, since)]
        looks = await look(redis, due, transit=sharded)
        self.looked += len(due)
        released = 0
        for keys, seen in zip(due, looks, strict=True):
            next_look = now + self._revisit_ms
            if seen.hold_ms is not None:
                next_look = min(next_look, now + seen.hold_ms)
            deadline = seen.earliest_deadline
            if deadline is not None and deadline <= now:
                released += await self._release_due(keys)
                next_look = now  # more may fall due by the next pass: look again then
            elif deadline is not None:
                next_look = min(next_look, deadline)
            transit = seen.earliest_transit
            if transit is not None and transit <= now - TRANSIT_GRACE_MS:
                await self._engine.deliver_in_transit(keys.item_id, keys.shard)
            self._seen[keys.events] = _Seen(seen.last_id, next_look, node)
        return released

    async def _release_due(self, keys: ItemKeys) -> int:
        """Every due hold of one shard, a batch at a time."""
        released = 0
        while True:
            due = await self._engine.expire_due(keys.item_id, limit=self._batch, shard=keys.shard)
            released += len(due)
            if len(due) < self._batch:
                return released
