"""The reconciler: drift injected by hand is found (every kind, every time) and repaired so the
invariants hold again; a healthy sale under load shows none."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
from redis.asyncio import Redis
from sqlalchemy import delete, update

from seckill.domain.events import ReleaseReason
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from seckill.services.items import warm_item
from seckill.services.reconcile.drift import Drift
from seckill.services.reconcile.reconciler import Reconciler
from seckill.services.reconcile.records import audit_records
from seckill.services.reconcile.recovery import recover_item
from seckill.store.ledger import Ledger
from seckill.store.tables import Inventory, Order
from seckill.workers.reconciler import ReconcilerWorker
from tests.conftest import new_item, pay
from tests.support.sales import Sale, assert_sql_matches_redis, drain
from tests.support.sales import sale as sale  # the fixture: an item on sale

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

GRACE_MS = 60_000


def reconciler(sale: Sale) -> Reconciler:
    return Reconciler(sale.engine, sale.ledger, grace_ms=GRACE_MS)


async def assert_invariants(sale: Sale) -> None:
    """Redis keeps every invariant and SQL agrees with it, order by order and in the counters."""
    failed = [c for c in await audit_item(sale.engine, sale.item_id, journal=False) if not c.ok]
    assert not failed, failed
    await assert_sql_matches_redis(sale)
    assert (await reconciler(sale).reconcile(sale.item_id)).found == []


async def repair_and_drain(sale: Sale, *kinds: Drift) -> None:
    """Repair: exactly ``kinds`` are found, nothing is left, each repair is journaled, and once
    the replays have landed the records agree."""
    report = await reconciler(sale).reconcile(sale.item_id, repair=True)
    assert sorted({f.kind for f in report.found}) == sorted(set(kinds)), report.found
    assert report.left == [], report.left
    assert report.repairs
    assert await sale.ledger.repairs(sale.item_id) != []
    await drain(sale)
    await assert_invariants(sale)


async def test_a_healthy_sale_under_load_shows_no_drift(sale: Sale) -> None:
    """Buyers, payments, releases and two persisters all running while the reconciler looks
    again and again: never a finding, though SQL is often behind Redis while it looks."""
    rng = random.Random(4)
    check = reconciler(sale)
    persisters = [sale.persister(), sale.persister()]
    stop = asyncio.Event()

    async def land() -> None:
        while not stop.is_set():
            await asyncio.gather(*(p.run_once() for p in persisters))

    async def buy_and_settle(n: int) -> None:
        order_id = await sale.buy(f"b{n}", rng.choice((1, 2)))
        if order_id and rng.random() < 0.7:
            await asyncio.sleep(rng.uniform(0, 0.02))
            if rng.random() < 0.6:
                await pay(sale.engine, sale.item_id, order_id)
            else:
                await sale.engine.release(sale.item_id, order_id, ReleaseReason.CANCELLED)

    looks, behind, findings = 0, 0, []

    async def watch() -> None:
        nonlocal looks, behind
        while not stop.is_set():
            report = await check.reconcile(sale.item_id)
            findings.extend(report.found)
            looks += 1
            behind += report.redis_stock != report.sql_stock

    landing, watching = asyncio.create_task(land()), asyncio.create_task(watch())
    start = 0
    # At least 1,500 buyers, and on a slow machine more, until the reconciler has looked often
    # (the sale's pace is the machine's; the check is that it looked mid-flight, repeatedly).
    while start < 1_500 or (looks < 10 and start < 20_000):
        await asyncio.gather(*(buy_and_settle(n) for n in range(start, start + 50)))
        start += 50
    stop.set()
    await asyncio.gather(landing, watching)
    assert findings == []
    assert looks >= 10 and behind > 0, (looks, behind)  # it looked mid-flight, more than once
    await drain(sale)
    await assert_invariants(sale)


async def test_events_deleted_before_they_landed_are_found_and_journaled_again(
    sale: Sale,
) -> None:
    ids = [await sale.buy(f"b{n}") for n in range(4)]
    assert all(ids)
    await pay(sale.engine, sale.item_id, ids[1])
    stream = sale.engine.keys(sale.item_id).events
    lost = {(str(ids[0]), "reserved"), (str(ids[1]), "paid")}
    for entry_id, fields in await sale.engine.events(sale.item_id):
        if (fields.get("order_id"), fields["event"]) in lost:
            await sale.redis.xdel(stream, entry_id)
    await drain(sale)
    report = await reconciler(sale).reconcile(sale.item_id)
    assert {(f.kind, f.order_id) for f in report.found} == {
        (Drift.ORDER_MISSING_IN_SQL, ids[0]),
        (Drift.ORDER_BEHIND_IN_SQL, ids[1]),
    }
    await repair_and_drain(sale, Drift.ORDER_MISSING_IN_SQL, Drift.ORDER_BEHIND_IN_SQL)
    assert (await sale.ledger.order(ids[1])).status == "paid"  # type: ignore[union-attr]


@pytest.mark.parametrize("edit", ["status", "quantity"])
async def test_an_edited_order_row_is_found_and_rewritten_from_its_journal(
    sale: Sale, edit: str
) -> None:
    ids = [await sale.buy(f"b{n}") for n in range(3)]
    await pay(sale.engine, sale.item_id, ids[0])  # type: ignore[arg-type]
    await drain(sale)
    change = {"status": "paid"} if edit == "status" else {"quantity": 2}
    async with sale.ledger.engine.begin() as conn:
        await conn.execute(update(Order).where(Order.id == ids[1]).values(**change))
    report = await reconciler(sale).reconcile(sale.item_id)
    expected = {
        (Drift.SQL_ORDER_EDITED, ids[1]),
        (Drift.SQL_COUNTERS, None),  # the inventory no longer sums its orders
    }
    if edit == "status":  # a row paid by hand names no payment: money the record cannot show
        expected.add((Drift.CHARGE_UNACCOUNTED, None))
    assert {(f.kind, f.order_id) for f in report.found} == expected
    await repair_and_drain(sale, *{kind for kind, _ in expected})


async def test_a_reserved_event_lost_after_its_payment_landed_is_a_gap_filled_from_the_row(
    sale: Sale,
) -> None:
    """The payment landed first (it makes the row), the `reserved` was parked and then lost
    with Redis: the row is right, the journal is not whole, and the audit said so forever."""
    ids = [await sale.buy(f"b{n}") for n in range(3)]
    await pay(sale.engine, sale.item_id, ids[1])  # type: ignore[arg-type]
    stream = sale.engine.keys(sale.item_id).events
    for entry_id, fields in await sale.engine.events(sale.item_id):
        if (fields.get("order_id"), fields["event"]) == (str(ids[1]), "reserved"):
            await sale.redis.xdel(stream, entry_id)
    await drain(sale)
    journal = await audit_records(sale.engine, sale.ledger, sale.item_id)
    assert [c.name for c in journal if not c.ok] == ["SQL journal complete"]

    report = await reconciler(sale).reconcile(sale.item_id, repair=True)

    assert [(f.kind, f.order_id) for f in report.found] == [(Drift.JOURNAL_GAP, ids[1])]
    assert report.left == []
    assert (await sale.ledger.journal_kinds(sale.item_id))["reserved"] == 3
    await assert_invariants(sale)
    assert all(c.ok for c in await audit_records(sale.engine, sale.ledger, sale.item_id))
    # Filled once: a second repair finds nothing to fill.
    assert await sale.ledger.journal_reservations(sale.item_id, [ids[1]]) == []  # type: ignore[list-item]


async def test_a_deleted_order_row_is_found_and_left_for_a_person(sale: Sale) -> None:
    ids = [await sale.buy(f"b{n}") for n in range(3)]
    await pay(sale.engine, sale.item_id, ids[0])  # type: ignore[arg-type]
    await drain(sale)
    async with sale.ledger.engine.begin() as conn:
        await conn.execute(delete(Order).where(Order.id == ids[0]))
    before = await sale.ledger.stock(sale.item_id)
    report = await reconciler(sale).reconcile(sale.item_id, repair=True)
    assert {(f.kind, f.order_id) for f in report.found} == {
        (Drift.SQL_ORDER_DELETED, ids[0]),
        (Drift.SQL_COUNTERS, None),  # the inventory no longer sums its orders
    }
    # Not repaired: the orders are incomplete, so the inventory is not recounted from them.
    assert {f.kind for f in report.left} == {Drift.SQL_ORDER_DELETED, Drift.SQL_COUNTERS}
    assert await sale.ledger.stock(sale.item_id) == before


async def test_a_redis_counter_bumped_by_hand_is_recounted_from_the_holds(sale: Sale) -> None:
    ids = [await sale.buy(f"b{n}") for n in range(3)]
    await pay(sale.engine, sale.item_id, ids[0])  # type: ignore[arg-type]
    await drain(sale)
    await sale.redis.hincrby(sale.engine.keys(sale.item_id).item, "available", 5)
    report = await reconciler(sale).reconcile(sale.item_id)
    assert {f.kind for f in report.found} == {Drift.REDIS_COUNTERS}
    await repair_and_drain(sale, Drift.REDIS_COUNTERS)


async def test_a_sql_counter_bumped_by_hand_is_recounted_from_the_orders(sale: Sale) -> None:
    await sale.buy("b1")
    await drain(sale)
    async with sale.ledger.engine.begin() as conn:
        await conn.execute(
            update(Inventory)
            .where(Inventory.item_id == sale.item_id)
            .values(held=Inventory.held + 3, available=Inventory.available - 3)
        )
    report = await reconciler(sale).reconcile(sale.item_id)
    assert [f.kind for f in report.found] == [Drift.SQL_COUNTERS]
    await repair_and_drain(sale, Drift.SQL_COUNTERS)


async def test_overdue_holds_are_found_and_released(sale: Sale) -> None:
    ids = [await sale.buy(f"b{n}") for n in range(2)]
    await drain(sale)
    holds = sale.engine.keys(sale.item_id).deadlines
    await sale.redis.zadd(holds, {str(ids[0]): 1_000})  # its deadline long gone; no reaper ran
    report = await reconciler(sale).reconcile(sale.item_id)
    assert [f.kind for f in report.found] == [Drift.OVERDUE_HOLDS]
    await repair_and_drain(sale, Drift.OVERDUE_HOLDS)
    assert (await sale.engine.hold(sale.item_id, ids[0])).reason is ReleaseReason.EXPIRED  # type: ignore[arg-type,union-attr]


async def test_flushall_mid_sale_then_recover_and_the_sale_goes_on(sale: Sale) -> None:
    rng = random.Random(6)
    ids = [o for o in [await sale.buy(f"b{n}", rng.choice((1, 2))) for n in range(300)] if o]
    for order_id in ids[:100]:
        await pay(sale.engine, sale.item_id, order_id)
    for order_id in ids[100:150]:
        await sale.engine.release(sale.item_id, order_id, ReleaseReason.CANCELLED)
    await drain(sale)
    before = await sale.ledger.stock(sale.item_id)
    await sale.redis.flushall()

    with pytest.raises(InvalidRequest) as refused:  # warming would put sold units on sale again
        await warm_item(sale.engine, sale.ledger, sale.item_id)
    assert refused.value.code is ErrorCode.ITEM_ACTIVE

    # Lost whole, it sells nothing as it is: the reconciler rebuilds it at once, even without
    # --repair (there is nothing in Redis to merge with), and journals it.
    report = await reconciler(sale).reconcile(sale.item_id)
    assert [f.kind for f in report.found] == [Drift.REDIS_LOST_ITEM]
    assert [r.kind for r in report.repairs] == [Drift.REDIS_LOST_ITEM]
    assert f"{len(ids)} holds restored" in report.repairs[0].detail
    assert await sale.engine.stock(sale.item_id) == before
    again = await recover_item(sale.engine, sale.ledger, sale.item_id)  # idempotent
    assert (again.restored, again.advanced, again.conflicts, again.stock) == (0, 0, 0, before)
    await drain(sale)  # the persister finds the stream again
    await assert_invariants(sale)

    # The sale goes on, under load, until sold out: no unit sold twice.
    answers = await asyncio.gather(*(sale.buy(f"c{n}") for n in range(1_500)))
    assert sum(1 for a in answers if a) > 0
    await drain(sale)
    await assert_invariants(sale)
    stock = await sale.engine.stock(sale.item_id)
    assert stock is not None and stock.available == 0 and stock.held + stock.sold == stock.total


async def test_only_the_lock_holder_reconciles(sale: Sale) -> None:
    workers = [
        ReconcilerWorker(
            reconciler=reconciler(sale),
            redis=sale.redis,
            scripts=sale.engine.scripts,
            prefix=sale.engine.prefix,
            interval_s=0,  # a whole pass at every call
            repair=False,
            engine=sale.engine,
        )
        for _ in range(3)
    ]
    for _ in range(3):
        await asyncio.gather(*(w.run_once() for w in workers))
    assert sorted(w.passes for w in workers) == [0, 0, 3]
    busy = next(w for w in workers if w.passes)
    assert [r.item_id for r in busy.reports] == [sale.item_id]


async def test_a_sharded_item_is_reconciled_shard_by_shard(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    """Stock over four shards, transfers between them: a healthy sale shows no drift; a counter
    bumped on one shard is found on that shard and recounted there; rebuilding it from SQL
    changes nothing a buyer was told."""
    item_id = await ledger.create_item(
        dataclasses.replace(new_item(total=16, limit=2), stock_shards=4)
    )
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(6))
    ids = [await sale.buy(f"b{n}", 2) for n in range(6)]  # homes run short: transfers
    assert all(ids)
    await drain(sale)
    await assert_invariants(sale)

    bumped = await engine.order_shard(item_id, ids[0])  # type: ignore[arg-type]
    await redis.hincrby(engine.keys(item_id, bumped).item, "held", 1)
    report = await reconciler(sale).reconcile(item_id)
    assert {(f.kind, f.shard) for f in report.found} == {(Drift.REDIS_COUNTERS, bumped)}
    await repair_and_drain(sale, Drift.REDIS_COUNTERS)
    await assert_invariants(sale)

    holds = await engine.holds(item_id)
    rebuilt = await recover_item(engine, ledger, item_id)
    assert (rebuilt.restored, rebuilt.advanced, rebuilt.conflicts) == (0, 0, 0)
    assert await engine.holds(item_id) == holds
    await drain(sale)
    await assert_invariants(sale)


async def test_items_compared_together_are_each_compared_as_alone(sale: Sale) -> None:
    """A pass compares items in batches (snapshots in one transaction, books in one SQL
    snapshot): each item's findings are its own, as when it is compared alone."""
    others = [await sale.ledger.create_item(new_item(total=10, limit=2)) for _ in range(4)]
    for item_id in others:
        await warm_item(sale.engine, sale.ledger, item_id)
        other = Sale(sale.engine, sale.ledger, sale.redis, item_id, sale.ids)
        assert await other.buy("b1") and await other.buy("b2")
        await drain(other)
    await sale.buy("b1")
    await drain(sale)
    bumped, edited = others[1], others[3]
    await sale.redis.hincrby(sale.engine.keys(bumped).item, "available", 5)
    async with sale.ledger.engine.begin() as conn:
        await conn.execute(
            update(Inventory)
            .where(Inventory.item_id == edited)
            .values(held=Inventory.held + 3, available=Inventory.available - 3)
        )
    item_ids = [sale.item_id, *others]

    together = await reconciler(sale).reconcile_many(item_ids)

    kinds = {r.item_id: {f.kind for f in r.found} for r in together}
    assert kinds == {
        sale.item_id: set(), others[0]: set(), bumped: {Drift.REDIS_COUNTERS}, others[2]: set(),
        edited: {Drift.SQL_COUNTERS},
    }  # fmt: skip
    alone = [await reconciler(sale).reconcile(item_id) for item_id in item_ids]
    assert [r.found for r in together] == [r.found for r in alone]
    assert [r.redis_stock for r in together] == [r.redis_stock for r in alone]


async def test_one_payment_id_on_two_items_is_reported_with_both_orders(sale: Sale) -> None:
    """Payment ids are scoped per item, a provider's are global: a charge the shop sent with the
    wrong item id paid an order of each. Each item's look reports it, naming both orders; an
    archived item's notices count too."""
    other_id = await sale.ledger.create_item(new_item(total=10, limit=2))
    await warm_item(sale.engine, sale.ledger, other_id)
    other = Sale(sale.engine, sale.ledger, sale.redis, other_id, sale.ids)
    here, there, alone = await sale.buy("b1"), await other.buy("b1"), await other.buy("b2")
    assert here and there and alone
    await pay(sale.engine, sale.item_id, here, "ch_shared")
    await pay(sale.engine, other_id, there, "ch_shared")
    await pay(sale.engine, other_id, alone, "ch_own")
    await drain(sale)
    await drain(other)

    reports = await reconciler(sale).reconcile_many([sale.item_id, other_id])

    both = f"item {sale.item_id} order {here}; item {other_id} order {there}"
    for report in reports:
        assert [(f.kind, f.subject, f.sql) for f in report.found] == [
            (Drift.PAYMENT_ON_TWO_ITEMS, "payment ch_shared", both)
        ], report.found
    assert (await reconciler(sale).reconcile(sale.item_id, repair=True)).left  # for a person
