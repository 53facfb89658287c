"""Redis crashes (kill -9) and comes back from an AOF taken earlier: it has lost writes it had
acknowledged, which SQL already landed. The reconciler finds it, recovery rebuilds the item from
SQL, and the sale goes on under load with no unit sold twice and no order twice."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from sqlalchemy import func, select

from seckill.domain.events import ReleaseReason
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.services.reconcile.drift import Drift
from seckill.services.reconcile.reconciler import Reconciler
from seckill.store.ledger import Ledger
from seckill.store.tables import Order
from tests.conftest import new_item, pay, redis7_binary
from tests.integration.test_reconcile import assert_invariants
from tests.support.redis_servers import connected, copy_aof, restore_aof
from tests.support.sales import Sale, drain

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")


async def trade(sale: Sale, rng: random.Random, buyers: range, open_holds: list[int]) -> None:
    """Buyers reserve; some of the open holds are paid, some released."""
    for n in buyers:
        order_id = await sale.buy(f"b{n}", rng.choice((1, 2)))
        if order_id:
            open_holds.append(order_id)
    rng.shuffle(open_holds)
    for _ in range(len(open_holds) // 2):
        order_id = open_holds.pop()
        if rng.random() < 0.7:
            await pay(sale.engine, sale.item_id, order_id)
        else:
            await sale.engine.release(sale.item_id, order_id, ReleaseReason.CANCELLED)


async def test_redis_back_from_an_older_aof_is_found_recovered_and_sells_on(
    ledger: Ledger, tmp_path: Path
) -> None:
    rng = random.Random(11)
    data_dir = tmp_path / "redis"
    server = RedisServer(binary=redis7_binary(), data_dir=data_dir, appendonly=True).start()
    ids = OrderIds(733)
    open_holds: list[int] = []
    try:
        async with connected(server) as (redis, engine):
            item_id = await ledger.create_item(new_item(total=600, limit=2))
            await warm_item(engine, ledger, item_id)
            sale = Sale(engine, ledger, redis, item_id, ids)
            await trade(sale, rng, range(0, 150), open_holds)
            await drain(sale)
            await asyncio.sleep(1.2)  # appendfsync everysec: let the AOF catch up
        server.kill()
        copy_aof(data_dir, tmp_path / "older")  # the AOF as it stood then
        server.start()

        async with connected(server) as (redis, engine):
            sale = Sale(engine, ledger, redis, item_id, ids)
            # Restarted: fenced until checked against SQL, which finds nothing lost.
            assert await sale.buy("early-bird") is None
            reconciler = Reconciler(engine, ledger, grace_ms=60_000)
            [verified] = await reconciler.verify_fenced([item_id])
            assert verified.repairs == [] and await engine.fenced_items([item_id]) == []
            await trade(sale, rng, range(150, 300), open_holds)
            await drain(sale)  # SQL now has everything
        server.kill()
        restore_aof(tmp_path / "older", data_dir)
        server.start()

        async with connected(server) as (redis, engine):
            sale = Sale(engine, ledger, redis, item_id, ids)
            # Back from the older AOF: fenced at once, so nothing is sold on what it lost.
            reserved = await engine.reserve(
                item_id, buyer="early-bird", quantity=1, idempotency_key="k", order_id=ids.next()
            )
            assert reserved.outcome is Outcome.ITEM_RECOVERING
            reconciler = Reconciler(engine, ledger, grace_ms=60_000)
            report = await reconciler.reconcile(item_id)
            kinds = {f.kind for f in report.found}
            assert {Drift.REDIS_REWOUND, Drift.ORDER_MISSING_IN_REDIS} <= kinds, kinds
            repaired = await reconciler.reconcile(item_id, repair=True)
            assert repaired.left == [], repaired.left
            await drain(sale)
            await assert_invariants(sale)

            # The sale goes on under load until sold out.
            answers = await asyncio.gather(*(sale.buy(f"c{n}") for n in range(800)))
            assert any(answers)
            await drain(sale)
            await assert_invariants(sale)
            stock = await engine.stock(item_id)
            assert stock is not None and stock.available == 0
            assert stock.held + stock.sold == stock.total  # oversold 0
            async with ledger.engine.connect() as conn:
                rows = await conn.scalar(
                    select(func.count()).select_from(Order).where(Order.item_id == item_id)
                )
            assert rows == len(await engine.holds(item_id))  # duplicated 0: one row per hold
    finally:
        server.stop()
