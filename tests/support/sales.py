"""A sale the integration tests drive straight through the engine (no HTTP): an item on sale,
buyers reserving on it, and the persister landing its streams until they are drained."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from seckill.domain.ids import OrderIds
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.streams import stream_drained
from seckill.services.items import warm_item
from seckill.services.reconcile.records import compare_records
from seckill.store.ledger import Ledger
from seckill.workers.persister import Persister, PersisterConfig
from tests.conftest import new_item

FAST = PersisterConfig(batch_size=200, block_ms=50, claim_idle_ms=200, trim_every_s=0.2)


@dataclass
class Sale:
    engine: RedisEngine
    ledger: Ledger
    redis: Redis
    item_id: int
    ids: OrderIds

    def persister(self, **config: Any) -> Persister:
        settings = dataclasses.replace(FAST, **config)
        return Persister(
            redis=self.redis, ledger=self.ledger, config=settings, prefix=DEFAULT_PREFIX
        )

    async def buy(self, buyer: str, quantity: int = 1) -> int | None:
        answer = await self.engine.reserve(
            self.item_id,
            buyer=buyer,
            quantity=quantity,
            idempotency_key="k",
            order_id=self.ids.next(),
        )
        return answer.order_id if answer.accepted else None


@pytest.fixture
async def sale(engine: RedisEngine, ledger: Ledger, redis: Redis) -> Sale:
    item_id = await ledger.create_item(new_item(total=1_000, limit=2))
    await warm_item(engine, ledger, item_id)
    return Sale(engine, ledger, redis, item_id, OrderIds(5))


async def drain(sale: Sale, *persisters: Persister, limit_s: float = 60) -> None:
    """Run the persisters until the item's streams (one per stock shard) are fully landed and
    acknowledged."""
    persisters = persisters or (sale.persister(),)
    streams = [keys.events for keys in await sale.engine.shard_keys(sale.item_id)]
    async with asyncio.timeout(limit_s):
        while True:
            await asyncio.gather(*(p.run_once() for p in persisters))
            if all([await stream_drained(sale.redis, stream) for stream in streams]):
                return


async def assert_sql_matches_redis(sale: Sale) -> None:
    failed = [c for c in await compare_records(sale.engine, sale.ledger, sale.item_id) if not c.ok]
    assert not failed, failed
