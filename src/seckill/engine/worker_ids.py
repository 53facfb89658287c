"""Leasing an order-id worker id from Redis, so no two live processes share one.

A process claims the first free ``seckill:worker-id:<n>`` (n in 0..1023, scanning from a random
start) as a ``Lease`` (see leases), and renews it every third of the lease.
Its id generator is valid only until the lease it last renewed would lapse, minus a margin: a
process that cannot renew in time (paused, partitioned) stops issuing ids rather than risk
sharing a worker id with the process that claims it next. A process that sets
``SECKILL_WORKER_ID`` skips the lease; the operator then owns uniqueness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator

from seckill.domain.ids import MAX_WORKER_ID, OrderIds
from seckill.engine.cluster import RedisClient
from seckill.engine.keys import worker_id_key
from seckill.engine.leases import Lease
from seckill.engine.scripts import Scripts

log = logging.getLogger(__name__)


class NoFreeWorkerId(RuntimeError):
    pass


class WorkerIdLease:
    """One of the 1,024 worker ids, leased: ``acquire()`` takes a free one, ``renew()`` keeps it
    and extends its generator's validity, ``drop()`` frees it."""

    def __init__(self, redis: RedisClient, *, scripts: Scripts, prefix: str, ttl_ms: int) -> None:
        self._redis = redis
        self._scripts = scripts
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._lease: Lease | None = None
        self.worker_id: int | None = None

    def _valid_until(self, renewed_at: float) -> float:
        # Stop a full third of the lease early: the margin covers clock-rate drift and the time
        # the renewal itself took.
        return renewed_at + (self._ttl_ms / 1000) * 2 / 3

    async def acquire(self) -> OrderIds:
        start = random.randrange(MAX_WORKER_ID + 1)
        for step in range(MAX_WORKER_ID + 1):
            candidate = (start + step) % (MAX_WORKER_ID + 1)
            lease = Lease(
                self._redis,
                scripts=self._scripts,
                key=worker_id_key(candidate, self._prefix),
                ttl_ms=self._ttl_ms,
            )
            sent_at = time.monotonic()
            if await lease.acquire():
                self._lease, self.worker_id = lease, candidate
                return OrderIds(candidate, valid_until=self._valid_until(sent_at))
        raise NoFreeWorkerId("all 1024 order-id worker ids are leased by live processes")

    async def renew(self, ids: OrderIds) -> bool:
        assert self._lease is not None
        sent_at = time.monotonic()
        renewed = await self._lease.renew()
        if renewed:
            ids.extend(self._valid_until(sent_at))
        return renewed

    async def drop(self) -> None:
        if self._lease is not None:
            await self._lease.drop()
            self._lease, self.worker_id = None, None

    async def keep(self, ids: OrderIds) -> None:
        """Renew until cancelled. A failed renewal is retried; the generator lapses meanwhile."""
        while True:
            await asyncio.sleep(self._ttl_ms / 3000)
            try:
                if not await self.renew(ids):
                    log.error("worker id %s was taken over; order ids stop", self.worker_id)
                    return
            except Exception:
                log.exception("renewing worker id %s failed; retrying", self.worker_id)


@contextlib.asynccontextmanager
async def leased_order_ids(
    redis: RedisClient, *, scripts: Scripts, prefix: str, ttl_ms: int
) -> AsyncIterator[OrderIds]:
    """An order-id generator on a leased worker id, renewed in the background while in use."""
    lease = WorkerIdLease(redis, scripts=scripts, prefix=prefix, ttl_ms=ttl_ms)
    ids = await lease.acquire()
    keeper = asyncio.create_task(lease.keep(ids), name=f"worker-id-{lease.worker_id}")
    try:
        yield ids
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        with contextlib.suppress(Exception):
            await lease.drop()
