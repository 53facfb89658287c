"""The reconciler worker: compares every item's Redis and SQL records each interval, logs the
drift it finds and, when asked to, repairs it (see ``seckill.reconcile``).

One pass at a time across all replicas: an upkeep lock in Redis (a ``Lease``, see
``seckill.engine.leases``) picks the replica that works; the others skip their pass. A holder
that dies lets the lock lapse after three intervals.
"""

from __future__ import annotations

import logging

from seckill.engine.cluster import RedisClient
from seckill.engine.keys import upkeep_lock_key
from seckill.engine.leases import Lease
from seckill.engine.scripts import Scripts
from seckill.observability import metrics
from seckill.reconcile.drift import Drift
from seckill.reconcile.reconciler import ItemReport, Reconciler

log = logging.getLogger(__name__)


class ReconcilerWorker:
    name = "reconciler"

    def __init__(
        self,
        *,
        reconciler: Reconciler,
        redis: RedisClient,
        scripts: Scripts,
        prefix: str,
        interval_s: float,
        repair: bool,
    ) -> None:
        self._reconciler = reconciler
        self._upkeep_lock = Lease(
            redis,
            scripts=scripts,
            key=upkeep_lock_key("reconciler", prefix),
            ttl_ms=int(interval_s * 3000),
        )
        self._repair = repair
        self.passes = 0
        self.reports: list[ItemReport] = []  # the last pass's

    async def run_once(self) -> int:
        """One pass over every item, if this replica holds the lock. Always 0: the loop then
        waits one interval before the next pass."""
        if not await self._hold_upkeep_lock():
            return 0
        item_ids = await self._reconciler.item_ids()
        reports = await self._reconciler.reconcile_many(item_ids, repair=self._repair)
        for report in reports:
            for finding in report.left:
                log.warning(
                    "item %d: %s %s: Redis %s, SQL %s %s",
                    report.item_id, finding.kind, finding.subject, finding.redis, finding.sql,
                    finding.detail,
                )  # fmt: skip
        self.reports = reports
        self.passes += 1
        metrics.record_reconciler_pass(Drift, (f.kind for r in reports for f in r.found))
        return 0

    async def _hold_upkeep_lock(self) -> bool:
        """Take the upkeep lock, or keep it if this replica holds it; False while another does."""
        return await self._upkeep_lock.acquire() or await self._upkeep_lock.renew()
