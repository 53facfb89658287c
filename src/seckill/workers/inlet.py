"""The inlet: lets the next buyers of every waiting room in, at the configured pace (the item's
own rate where it has one).

Each pass takes one step of ``queue_advance`` per queued item (see that script for the rule: a
rate, a stock cap per unit available within a turn, everyone queued). Only items created with a
waiting room have a queue to step: nobody can join another's. One process steps at a
time across all replicas, holding the upkeep lock (a ``Lease``); a holder that dies lets it lapse
after a few intervals and another replica carries on from the state in Redis. An item whose sale
ended, or that is gone, leaves the inlet's rounds. With no queue at all, the inlet looks for one
every ``QUIET_LOOK_S`` instead of every tick, and takes no lock: a deployment without waiting
rooms pays for it a command and a wake-up a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from seckill.domain.outcomes import Outcome
from seckill.engine.cluster import REDIS_UNAVAILABLE, RedisClient
from seckill.engine.keys import upkeep_lock_key
from seckill.engine.leases import Lease
from seckill.engine.queues import Queues
from seckill.engine.scripts import Scripts
from seckill.observability import metrics

log = logging.getLogger(__name__)

# With no queue found, how long the inlet waits before it looks again: a waiting room opens
# before its sale (queue_open_seconds), so its first step may come this much later.
QUIET_LOOK_S = 1.0


class Inlet:
    name = "inlet"

    def __init__(
        self,
        *,
        queues: Queues,
        redis: RedisClient,
        scripts: Scripts,
        prefix: str,
        interval_s: float,
        rate: int,
        per_unit: int,
        turn_ms: int,
        stop: asyncio.Event | None = None,
    ) -> None:
        self._queues = queues
        self._interval_s = interval_s
        self._stop = stop or asyncio.Event()
        self._upkeep_lock = Lease(
            redis,
            scripts=scripts,
            key=upkeep_lock_key("inlet", prefix),
            ttl_ms=max(1000, int(interval_s * 5000)),
        )
        self._rate = rate
        self._per_unit = per_unit
        self._turn_ms = turn_ms
        self.admitted = 0  # positions let in by this process

    async def run_once(self) -> int:
        """One step for every queued item, if this replica holds the lock. Always 0: the loop
        then waits one interval, the inlet's tick (``admitted`` counts what it let in)."""
        queued = await self._queues.queued_items()
        if not queued:
            # The loop's own pause (one tick) follows: together, one look a QUIET_LOOK_S.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, QUIET_LOOK_S - self._interval_s))
            return 0
        if not await self._upkeep_lock.hold():
            return 0
        moved = 0
        for item_id in queued:
            try:
                moved += await self._step(item_id)
            except REDIS_UNAVAILABLE as exc:
                log.warning("inlet: Redis did not answer for item %d: %s", item_id, exc)
        self.admitted += moved
        return 0

    async def _step(self, item_id: int) -> int:
        step = await self._queues.advance(
            item_id, rate=self._rate, per_unit=self._per_unit, turn_ms=self._turn_ms
        )
        if step.outcome in (Outcome.ENDED, Outcome.UNKNOWN_ITEM):
            await self._queues.retire(item_id)
        if step.outcome is not Outcome.ADVANCED:
            return 0
        label = str(item_id)
        metrics.QUEUE_LENGTH.labels(item=label).set(step.length)
        metrics.QUEUE_ADMITTED.labels(item=label).set(step.admitted_up_to)
        metrics.QUEUE_ADMISSIONS.labels(item=label).inc(step.moved)
        return step.moved
