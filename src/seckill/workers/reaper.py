"""The reaper: releases holds past their deadline, so unpaid stock goes back on sale.

Each pass walks the items registry and calls ``expire_due`` per item until nothing is due. The
script decides with Redis's clock and moves each hold once (held -> released is a compare-and-set
inside it), so any number of reapers may run side by side: they only share the work.
"""

from __future__ import annotations

import time

from seckill.engine.engine import RedisEngine
from seckill.observability import metrics


class Reaper:
    name = "reaper"

    def __init__(self, *, engine: RedisEngine, batch: int = 500) -> None:
        self._engine = engine
        self._batch = batch
        self.released = 0

    async def run_once(self) -> int:
        """Release every hold due now, in every item; returns how many."""
        released = 0
        for item_id in await self._engine.item_ids():
            while True:
                due = await self._engine.expire_due(item_id, limit=self._batch)
                released += len(due)
                if len(due) < self._batch:
                    break
        self.released += released
        metrics.REAPER_RELEASES.inc(released)
        metrics.REAPER_LAST_PASS.set(time.time())
        return released
