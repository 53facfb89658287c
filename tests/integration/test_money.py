"""Money in SQL (real Redis and every SQL backend): each paid order lands with its payment, each
refund owed lands once as a row of its own, and the audit and the reconciler see money: a
refund lost on its way is found and journaled again, a payment id planted on two orders is
found and named."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import insert, select

from seckill.domain.events import ReleaseReason
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus
from seckill.engine.audit import audit_item
from seckill.services.reconcile.drift import Drift
from seckill.services.reconcile.reconciler import Reconciler
from seckill.services.reconcile.records import audit_records
from seckill.store.tables import Order, Refund
from tests.conftest import pay
from tests.support.sales import Sale, drain
from tests.support.sales import sale as sale  # the fixture: an item on sale

PRICE = Money(999, "USD")  # tests.conftest.new_item's, for one unit


def reconciler(sale: Sale) -> Reconciler:
    return Reconciler(sale.engine, sale.ledger, grace_ms=60_000)


async def failed_checks(sale: Sale) -> dict[str, str]:
    return {
        c.name: c.detail
        for c in await audit_records(sale.engine, sale.ledger, sale.item_id)
        if not c.ok
    }


async def charged(sale: Sale) -> dict[str, int]:
    """A sale whose charges are every kind: paid, paid twice, a released order paid twice."""
    ids = [await sale.buy(f"b{n}") for n in range(4)]
    assert all(ids)
    paid, doubled, cancelled, _ = (i for i in ids if i is not None)
    await pay(sale.engine, sale.item_id, paid, "p-paid", price=PRICE)
    await pay(sale.engine, sale.item_id, doubled, "p-first", price=PRICE)
    for _ in range(3):  # the second charge, and the provider's retries of it
        await pay(sale.engine, sale.item_id, doubled, "p-second", price=PRICE)
    await sale.engine.release(sale.item_id, cancelled, ReleaseReason.CANCELLED)
    for payment_id in ("p-late-1", "p-late-2", "p-late-1"):
        await pay(sale.engine, sale.item_id, cancelled, payment_id, price=PRICE)
    return {"paid": paid, "doubled": doubled, "cancelled": cancelled}


async def test_every_charge_lands_as_a_sale_or_one_refund_owed(sale: Sale) -> None:
    orders = await charged(sale)
    await drain(sale, sale.persister(), sale.persister())

    async with sale.ledger.engine.connect() as conn:
        rows = await conn.execute(
            select(Order.id, Order.payment_id).where(Order.item_id == sale.item_id)
        )
        paid_by = {row.id: row.payment_id for row in rows}
        owed = {
            r.payment_id: (r.order_id, r.reason, Money(r.amount_cents, r.currency), r.refunded_at)
            for r in await conn.execute(select(Refund).where(Refund.item_id == sale.item_id))
        }
    assert paid_by[orders["paid"]] == "p-paid"
    assert paid_by[orders["doubled"]] == "p-first"
    assert paid_by[orders["cancelled"]] is None
    assert owed == {
        "p-second": (orders["doubled"], "duplicate_charge", PRICE, None),
        "p-late-1": (orders["cancelled"], "cancelled", PRICE, None),
        "p-late-2": (orders["cancelled"], "cancelled", PRICE, None),
    }
    landed = await sale.ledger.order(orders["cancelled"])
    assert landed is not None and landed.status is OrderStatus.REFUND_REQUIRED
    doubled = await sale.ledger.order(orders["doubled"])
    assert doubled is not None and doubled.status is OrderStatus.PAID  # a second charge moves none
    assert (await sale.ledger.journal_kinds(sale.item_id))["refund_required"] == 3
    assert await failed_checks(sale) == {}
    checks = {c.name: c.detail for c in await audit_records(sale.engine, sale.ledger, sale.item_id)}
    assert checks["every charge accounted for"].startswith("2 sales, 3 refunds owed, 0 unaccounted")
    assert checks["SQL: every charge accounted for"].startswith("2 sales, 3 refunds owed")
    assert (await reconciler(sale).reconcile(sale.item_id)).found == []


async def test_a_refund_lost_before_it_landed_is_found_and_journaled_again(sale: Sale) -> None:
    orders = await charged(sale)
    stream = sale.engine.keys(sale.item_id).events
    for entry_id, fields in await sale.engine.events(sale.item_id):
        if fields.get("payment_id") == "p-second":
            await sale.redis.xdel(stream, entry_id)  # lost before the persister read it
    await drain(sale)
    assert await failed_checks(sale)  # SQL owes one refund fewer than Redis

    report = await reconciler(sale).reconcile(sale.item_id, repair=True)
    assert [(f.kind, f.payment_id) for f in report.found] == [
        (Drift.REFUND_MISSING_IN_SQL, "p-second")
    ]
    assert report.left == []
    await drain(sale)
    refund = await sale.ledger.payments.refund(sale.item_id, "p-second")
    assert refund is not None and (refund.order_id, refund.reason) == (
        orders["doubled"],
        "duplicate_charge",
    )
    assert await failed_checks(sale) == {}
    # Journaled again once more, it still lands once.
    assert await sale.engine.replay_refunds(sale.item_id, 0, ["p-second"]) == ["p-second"]
    await drain(sale)
    page = await sale.ledger.payments.refunds(item_id=sale.item_id)
    assert sorted(r.payment_id for r in page.refunds) == ["p-late-1", "p-late-2", "p-second"]


async def test_a_payment_id_planted_on_two_orders_is_found_and_named(sale: Sale) -> None:
    orders = await charged(sale)
    await drain(sale)
    # By hand: the first order's payment also owed back for another order.
    async with sale.ledger.engine.begin() as conn:
        await conn.execute(
            insert(Refund).values(
                item_id=sale.item_id, payment_id="p-paid", order_id=orders["cancelled"],
                buyer="b2", quantity=1, amount_cents=999, currency="USD", reason="cancelled",
                shard=0,
                event_id="1-1", owed_at=datetime.now(UTC),
            )
        )  # fmt: skip
    report = await reconciler(sale).reconcile(sale.item_id, repair=True)
    reused = [f for f in report.found if f.kind is Drift.PAYMENT_REUSED]
    assert [(f.subject, f.redis) for f in reused] == [("payment p-paid", "SQL")]
    assert str(orders["paid"]) in reused[0].detail and str(orders["cancelled"]) in reused[0].detail
    assert Drift.PAYMENT_REUSED in {f.kind for f in report.left}  # a person decides
    failed = await failed_checks(sale)
    assert "p-paid" in failed["SQL: every charge accounted for"]
    assert "every charge accounted for" not in failed  # Redis's own charges are sound
    assert all(c.ok for c in await audit_item(sale.engine, sale.item_id, journal=False))
