"""Each engine operation and outcome, against a real Redis (6.2 and 7)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from redis.asyncio import Redis

from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.holds import HoldState
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from tests.conftest import FREE, ManualClock, open_item, pay

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

ids = OrderIds(1)


async def buy(
    engine: RedisEngine, buyer: str, quantity: int = 1, *, key: str = "", item_id: int = 1
):
    return await engine.reserve(
        item_id,
        buyer=buyer,
        quantity=quantity,
        idempotency_key=key or f"{buyer}-{ids.next()}",
        order_id=ids.next(),
    )


async def assert_audit_passes(engine: RedisEngine, item_id: int = 1) -> None:
    failed = [c for c in await audit_item(engine, item_id) if not c.ok]
    assert not failed


async def test_reserve_holds_stock_and_journals_it(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=3, limit=2, hold_ms=30_000))
    before = time.time() * 1000
    reservation = await buy(engine, "alice", 2)
    assert reservation.accepted and not reservation.replayed
    assert reservation.order_id is not None and reservation.deadline_ms is not None
    assert before + 29_000 < reservation.deadline_ms < time.time() * 1000 + 31_000
    assert await engine.stock(1) == dataclasses.replace(await engine.stock(1), available=1, held=2)
    hold = await engine.hold(1, reservation.order_id)
    assert hold is not None and (hold.buyer, hold.quantity, hold.state) == (
        "alice",
        2,
        HoldState.HELD,
    )
    events = await engine.events(1)
    assert [e["event"] for _, e in events] == ["loaded", "reserved"]
    assert events[1][1]["order_id"] == str(reservation.order_id)
    await assert_audit_passes(engine)


async def test_outcomes_that_reserve_nothing(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=2, limit=2))
    assert (await buy(engine, "a", 2)).accepted
    assert (await buy(engine, "a", 1)).outcome is Outcome.LIMIT_REACHED
    assert (await buy(engine, "b", 1)).outcome is Outcome.SOLD_OUT
    assert (await buy(engine, "b", 1, item_id=99)).outcome is Outcome.UNKNOWN_ITEM
    await engine.load_item(open_item(item_id=2, total=1, limit=2))
    assert (await buy(engine, "b", 2, item_id=2)).outcome is Outcome.INSUFFICIENT_STOCK
    await assert_audit_passes(engine)


async def test_the_sale_window(timed_engine: RedisEngine, clock: ManualClock) -> None:
    item = dataclasses.replace(
        open_item(), starts_at_ms=clock.now_ms + 1_000, ends_at_ms=clock.now_ms + 2_000
    )
    await timed_engine.load_item(item)
    assert (await buy(timed_engine, "a")).outcome is Outcome.NOT_STARTED
    clock.advance(1_000)
    assert (await buy(timed_engine, "a")).accepted
    clock.advance(1_000)  # the window is [start, end): end itself is over
    assert (await buy(timed_engine, "b")).outcome is Outcome.ENDED


async def test_a_paid_order_stays_paid_and_refuses_a_release(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=5, limit=5))
    r = await buy(engine, "a", 3)
    assert r.order_id
    assert (await pay(engine, 1, r.order_id)).outcome is Outcome.PAID
    again = await pay(engine, 1, r.order_id)  # the provider's retry: the first answer
    assert (again.outcome, again.replayed) == (Outcome.PAID, True)
    second = await pay(engine, 1, r.order_id, "pay-twice")  # a second charge: owed back
    assert (second.outcome, second.reason) == (
        Outcome.REFUND_REQUIRED,
        RefundReason.DUPLICATE_CHARGE,
    )
    assert (
        await engine.release(1, r.order_id, ReleaseReason.CANCELLED)
    ).outcome is Outcome.ALREADY_PAID
    stock = await engine.stock(1)
    assert stock is not None and (stock.available, stock.held, stock.sold) == (2, 0, 3)
    await assert_audit_passes(engine)


async def test_release_returns_stock_once_and_a_payment_after_it_is_refunded(
    engine: RedisEngine,
) -> None:
    await engine.load_item(open_item(total=1, limit=1))
    r = await buy(engine, "a")
    assert r.order_id
    first = await engine.release(1, r.order_id, ReleaseReason.PAYMENT_FAILED)
    again = await engine.release(1, r.order_id, ReleaseReason.CANCELLED)
    assert (first.outcome, first.reason) == (Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED)
    assert (again.outcome, again.reason) == (Outcome.ALREADY_RELEASED, ReleaseReason.PAYMENT_FAILED)
    late = await pay(engine, 1, r.order_id)
    assert (late.outcome, late.reason) == (Outcome.REFUND_REQUIRED, ReleaseReason.PAYMENT_FAILED)
    stock = await engine.stock(1)
    assert stock is not None and (stock.available, stock.held, stock.sold) == (1, 0, 0)
    assert await engine.buyer_units(1) == {}  # the buyer's quota came back too
    assert (await buy(engine, "a")).accepted
    await assert_audit_passes(engine)


async def test_unknown_orders(engine: RedisEngine) -> None:
    await engine.load_item(open_item())
    failed = await engine.settle_payment(
        1, 12345, payment_id="p", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert failed.outcome is Outcome.UNKNOWN_ORDER  # a charge for one is a refund owed
    assert (
        await engine.release(1, 12345, ReleaseReason.CANCELLED)
    ).outcome is Outcome.UNKNOWN_ORDER


async def test_expire_due_releases_oldest_first_within_the_limit(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=10, limit=1, hold_ms=1_000))
    early = [await buy(timed_engine, f"early{i}") for i in range(3)]
    clock.advance(500)
    late = await buy(timed_engine, "late")
    clock.advance(499)
    assert await timed_engine.expire_due(1) == []  # nothing due before its deadline
    clock.advance(1)
    assert await timed_engine.expire_due(1, limit=2) == [r.order_id for r in early[:2]]
    assert await timed_engine.expire_due(1) == [early[2].order_id]
    clock.advance(500)
    assert await timed_engine.expire_due(1) == [late.order_id]
    stock = await timed_engine.stock(1)
    assert stock is not None and (stock.available, stock.held) == (10, 0)
    await assert_audit_passes(timed_engine)


async def test_a_payment_past_the_deadline_releases_and_is_refunded(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=1, hold_ms=1_000))
    r = await buy(timed_engine, "a")
    assert r.order_id
    clock.advance(1_000)  # due, but the reaper has not run yet
    late = await pay(timed_engine, 1, r.order_id)
    assert (late.outcome, late.reason) == (Outcome.REFUND_REQUIRED, ReleaseReason.EXPIRED)
    stock = await timed_engine.stock(1)
    assert stock is not None and (stock.available, stock.sold) == (1, 0)
    assert await timed_engine.expire_due(1) == []
    await assert_audit_passes(timed_engine)


async def test_loading_an_active_item_never_resets_its_stock(engine: RedisEngine) -> None:
    item = open_item(total=10, limit=5)
    assert await engine.load_item(item) is Outcome.LOADED
    r = await buy(engine, "a", 3)
    assert r.order_id
    await pay(engine, 1, r.order_id)
    await buy(engine, "b", 2)
    with pytest.raises(InvalidRequest) as refused:
        await engine.load_item(item)
    assert refused.value.code is ErrorCode.ITEM_ACTIVE
    with pytest.raises(InvalidRequest) as too_small:
        await engine.load_item(dataclasses.replace(item, total=4), force=True)
    assert too_small.value.code is ErrorCode.TOTAL_BELOW_COMMITTED
    with pytest.raises(InvalidRequest) as limit_too_low:  # "a" has 3 units
        await engine.load_item(dataclasses.replace(item, per_buyer_limit=2), force=True)
    assert limit_too_low.value.code is ErrorCode.LIMIT_BELOW_COMMITTED
    assert (
        await engine.load_item(dataclasses.replace(item, total=20), force=True) is Outcome.RELOADED
    )
    stock = await engine.stock(1)
    assert stock is not None and (stock.total, stock.available, stock.held, stock.sold) == (
        20,
        15,
        2,
        3,
    )
    await assert_audit_passes(engine)


async def test_an_idle_item_reloads_from_scratch(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=10))
    r = await buy(engine, "a")
    assert r.order_id
    await engine.release(1, r.order_id, ReleaseReason.CANCELLED)
    assert await engine.load_item(open_item(total=7)) is Outcome.LOADED
    stock = await engine.stock(1)
    assert stock is not None and (stock.total, stock.available) == (7, 7)


async def test_a_script_cache_flush_is_survived(engine: RedisEngine, redis: Redis) -> None:
    await engine.load_item(open_item())
    await redis.script_flush()
    assert (await buy(engine, "a")).accepted
