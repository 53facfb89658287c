"""The reconciler worker: compares every item's Redis and SQL records each interval, logs the
drift it finds and, when asked to, repairs it (see ``seckill.reconcile``).

One pass at a time across all replicas: an upkeep lock in Redis (``SET NX PX`` with an owner
token, renewed by compare-and-set) picks the replica that works; the others skip their pass. A
holder that dies lets the lock lapse after three intervals.
"""

from __future__ import annotations

import logging
import secrets

from redis.asyncio import Redis

from seckill.engine.keys import upkeep_lock_key
from seckill.engine.scripts import ScriptName, Scripts
from seckill.observability import metrics
from seckill.reconcile.drift import Drift
from seckill.reconcile.reconciler import ItemReport, Reconciler

log = logging.getLogger(__name__)


class UpkeepLock:
    """At most one holder across processes; the holder keeps it by renewing it in time."""

    def __init__(self, redis: Redis, *, key: str, ttl_ms: int) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)
        self._key = key
        self._ttl_ms = ttl_ms
        self._token = secrets.token_hex(8)

    async def hold(self) -> bool:
        """Take the lock, or keep it if already ours; False while another process holds it."""
        if await self._redis.set(self._key, self._token, nx=True, px=self._ttl_ms):
            return True
        renewed = await self._scripts.call(
            ScriptName.RENEW_LEASE, (self._key,), (self._token, self._ttl_ms)
        )
        return bool(renewed)


class ReconcilerWorker:
    name = "reconciler"

    def __init__(
        self,
        *,
        reconciler: Reconciler,
        redis: Redis,
        prefix: str,
        interval_s: float,
        repair: bool,
    ) -> None:
        self._reconciler = reconciler
        self._lock = UpkeepLock(
            redis, key=upkeep_lock_key("reconciler", prefix), ttl_ms=int(interval_s * 3000)
        )
        self._repair = repair
        self.passes = 0
        self.reports: list[ItemReport] = []  # the last pass's

    async def run_once(self) -> int:
        """One pass over every item, if this replica holds the lock. Always 0: the loop then
        waits one interval before the next pass."""
        if not await self._lock.hold():
            return 0
        reports = []
        for item_id in await self._reconciler.item_ids():
            report = await self._reconciler.reconcile(item_id, repair=self._repair)
            for finding in report.left:
                log.warning(
                    "item %d: %s %s: Redis %s, SQL %s %s",
                    item_id, finding.kind, finding.subject, finding.redis, finding.sql,
                    finding.detail,
                )  # fmt: skip
            reports.append(report)
        self.reports = reports
        self.passes += 1
        metrics.record_reconciler_pass(Drift, (f.kind for r in reports for f in r.found))
        return 0
