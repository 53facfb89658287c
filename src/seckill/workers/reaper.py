"""The reaper: releases holds past their deadline, so unpaid stock goes back on sale.

Each pass walks the items registry and calls ``expire_due`` per item until nothing is due. The
script decides with Redis's clock and moves each hold once (held -> released is a compare-and-set
inside it), so any number of reapers may run side by side: they only share the work. An item
whose Redis node does not answer (a cluster's master failing over) does not stop the pass: the
items on the other nodes are reaped at the usual pace, and the pass fails (and the loop backs
off) only when no item's node answered.
"""

from __future__ import annotations

import logging
import time

from seckill.engine.cluster import REDIS_UNAVAILABLE
from seckill.engine.engine import RedisEngine
from seckill.observability import metrics

log = logging.getLogger(__name__)


class Reaper:
    name = "reaper"

    def __init__(self, *, engine: RedisEngine, batch: int = 500) -> None:
        self._engine = engine
        self._batch = batch
        self.released = 0

    async def run_once(self) -> int:
        """Release every hold due now, in every item and shard; returns how many."""
        released = 0
        item_ids = await self._engine.item_ids()
        unanswered: dict[int, Exception] = {}
        for item_id in item_ids:
            try:
                released += await self._release_due(item_id)
            except REDIS_UNAVAILABLE as exc:
                unanswered[item_id] = exc
        self.released += released
        metrics.REAPER_RELEASES.inc(released)
        if unanswered:
            first = next(iter(unanswered.values()))
            if len(unanswered) == len(item_ids):
                raise first
            log.warning("reaper: Redis did not answer for items %s: %s", sorted(unanswered), first)
        metrics.REAPER_LAST_PASS.set(time.time())
        return released

    async def _release_due(self, item_id: int) -> int:
        """Every shard's due holds; on a sharded item, also the stock transfers left in
        transit by a sender that stopped between the two halves."""
        released = 0
        shards = await self._engine.shard_count(item_id)
        for shard in range(shards):
            while True:
                due = await self._engine.expire_due(item_id, limit=self._batch, shard=shard)
                released += len(due)
                if len(due) < self._batch:
                    break
            if shards > 1:
                await self._engine.deliver_in_transit(item_id, shard)
        return released
