"""The reconciler worker: compares every item's Redis and SQL records each interval, logs the
drift it finds and, when asked to, repairs it (see ``seckill.services.reconcile``); and, far
more often, checks the items whose Redis restarted or lost writes (fenced: they sell nothing)
against SQL, rebuilding what was lost, so that they sell again within a moment.

The fence check looks at every item only when the servers changed (a restart, a failover, a slot
moved: each server's run id and, on a cluster, the slots it serves, read in a command per
server), which is when a shard can fall behind its Redis unseen; between changes, at the items a
detector fenced (they are flagged in Redis as they are). So a fence is noticed within one pause
whatever the number of items, at the cost of a few commands a pass.

One pass at a time across all replicas: an upkeep lock in Redis (a ``Lease``, see
``seckill.engine.leases``) picks the replica that works; the others skip their pass. A holder
that dies lets the lock lapse after ``LEASE_TTL_MS``, and another replica takes over.
"""

from __future__ import annotations

import logging
import time

from seckill.engine.cluster import RedisClient
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import upkeep_lock_key
from seckill.engine.leases import Lease
from seckill.engine.scripts import Scripts
from seckill.observability import metrics
from seckill.services.reconcile.drift import Drift
from seckill.services.reconcile.reconciler import ItemReport, Reconciler

log = logging.getLogger(__name__)

# The holder renews the lock at every fence check (a fraction of a second): a dead one's lapses
# soon, so fenced items wait little for another replica.
LEASE_TTL_MS = 3_000


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
        engine: RedisEngine,
    ) -> None:
        self._reconciler = reconciler
        self._engine = engine
        self._interval_s = interval_s
        self._next_pass = 0.0
        self._upkeep_lock = Lease(
            redis,
            scripts=scripts,
            key=upkeep_lock_key("reconciler", prefix),
            ttl_ms=LEASE_TTL_MS,
        )
        self._repair = repair
        # The servers as they were when every item was last checked (None: not yet).
        self._servers_checked: frozenset[tuple[object, ...]] | None = None
        self.passes = 0
        self.reports: list[ItemReport] = []  # the last pass's

    async def run_once(self) -> int:
        """If this replica holds the lock: the fenced items checked (every call), and every
        item compared once an interval has passed since the last such pass. Returns the items
        verified or rebuilt: the loop waits the fence check's pause when there were none."""
        if not await self._hold_upkeep_lock():
            return 0
        fenced = await self._check_fences()
        if time.monotonic() >= self._next_pass:
            self._next_pass = time.monotonic() + self._interval_s
            await self._full_pass()
        return len(fenced)

    async def _check_fences(self) -> list[ItemReport]:
        """The fenced items checked against SQL (see the module's docstring): every item after
        the servers changed, else those flagged since the last look."""
        flagged, servers = await self._engine.fence_look()
        if servers is None or servers != self._servers_checked:
            reports = await self._reconciler.verify_fenced(await self._engine.item_ids())
            self._servers_checked = servers
            return reports
        try:
            return await self._reconciler.verify_fenced(flagged)
        except BaseException:
            await self._engine.flag_fenced(flagged)  # taken, not checked: next time
            raise

    async def _full_pass(self) -> None:
        item_ids = await self._reconciler.item_ids()
        reports = await self._reconciler.reconcile_many(item_ids, repair=self._repair)
        for report in reports:
            for finding in report.left:
                log.warning(
                    "item %d: %s %s: Redis %s, SQL %s %s",
                    report.item_id, finding.kind, finding.subject, finding.redis, finding.sql,
                    finding.detail,
                )  # fmt: skip
        owed = await self._reconciler.refunds_owed()
        self.reports = reports
        self.passes += 1
        found = (f.kind for r in reports for f in r.found)
        metrics.record_reconciler_pass(Drift, found, refunds_owed=owed)

    async def _hold_upkeep_lock(self) -> bool:
        """Take the upkeep lock, or keep it if this replica holds it; False while another does."""
        return await self._upkeep_lock.hold()
