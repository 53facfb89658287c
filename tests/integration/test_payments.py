"""Payments against a real Redis: every charge ends as a sale or a refund owed, once per payment
id; a payment id belongs to one order of its item, whatever the timing and the shards.

Most rules are one script's and one Redis version checks them (test_engine_model.py drives
settle_payment on 6.2, 7 and a cluster). The races run on every variant: two notices at once,
on one shard or on two.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.holds import HoldState, PaymentSettlement
from seckill.domain.ids import OrderIds
from seckill.domain.items import Stock
from seckill.domain.money import Money
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.shards import home_shard
from seckill.engine.audit import audit_item
from seckill.engine.cluster import RedisClient
from seckill.engine.engine import RedisEngine
from tests.conftest import FREE, ManualClock, open_item, pay

pytestmark = pytest.mark.redis_variants("redis7")
EVERY_VARIANT = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

ids = OrderIds(6)


async def hold_one(engine: RedisEngine, buyer: str = "alice", quantity: int = 1) -> int:
    answer = await engine.reserve(
        1, buyer=buyer, quantity=quantity, idempotency_key="k", order_id=ids.next()
    )
    assert answer.accepted and answer.order_id is not None
    return answer.order_id


async def journal(engine: RedisEngine) -> list[str]:
    return [fields["event"] for _, fields in await engine.events(1)]


async def refunds(engine: RedisEngine) -> list[dict[str, str]]:
    """The `refund_required` events of every shard, without their times."""
    return [
        {k: v for k, v in fields.items() if k != "at_ms"}
        for keys in await engine.shard_keys(1)
        for _, fields in await engine.events(1, keys.shard)
        if fields["event"] == "refund_required"
    ]


async def payments(redis: RedisClient, engine: RedisEngine) -> dict[str, dict[str, Any]]:
    raw = cast(dict[str, str], await redis.hgetall(engine.keys(1).payments))
    return {payment_id: json.loads(record) for payment_id, record in raw.items()}


async def state(redis: Redis, engine: RedisEngine) -> tuple[Any, ...]:
    """Everything the scripts write for item 1."""
    return (
        await engine.stock(1),
        await engine.holds(1),
        await engine.events(1),
        await engine.buyer_units(1),
        await engine.deadlines(1),
        await payments(redis, engine),
    )


async def assert_audit_passes(engine: RedisEngine) -> None:
    failed = [c for c in await audit_item(engine, 1) if not c.ok]
    assert not failed, failed


async def test_a_payment_after_a_cancel_is_one_refund_owed(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=2, limit=2))
    order_id = await hold_one(engine, quantity=2)
    await engine.release(1, order_id, ReleaseReason.CANCELLED)
    stock_after_release = await engine.stock(1)

    answers = [await pay(engine, 1, order_id) for _ in range(3)]  # the provider retries
    assert {(a.outcome, a.reason) for a in answers} == {
        (Outcome.REFUND_REQUIRED, RefundReason.CANCELLED)
    }
    assert [a.replayed for a in answers] == [False, True, True]
    assert await journal(engine) == ["loaded", "reserved", "released", "refund_required"]
    assert await refunds(engine) == [
        {
            "event": "refund_required",
            "item_id": "1",
            "order_id": str(order_id),
            "buyer": "alice",
            "quantity": "2",
            "reason": "cancelled",
            "payment_id": f"pay-{order_id}",
            "amount": "0",
            "currency": "USD",
        }
    ]
    hold = await engine.hold(1, order_id)
    assert hold is not None
    assert (hold.state, hold.reason, hold.refund_required) == (
        HoldState.RELEASED,
        ReleaseReason.CANCELLED,
        True,
    )
    assert await engine.stock(1) == stock_after_release == Stock(2, 2, 0, 0)
    await assert_audit_passes(engine)


async def test_two_charges_for_a_released_order_are_two_refunds_owed(
    engine: RedisEngine,
) -> None:
    await engine.load_item(open_item(total=1))
    order_id = await hold_one(engine)
    await engine.release(1, order_id, ReleaseReason.CANCELLED)
    for payment_id in ("charge-1", "charge-2", "charge-1", "charge-2"):
        answer = await pay(engine, 1, order_id, payment_id)
        assert (answer.outcome, answer.reason) == (Outcome.REFUND_REQUIRED, RefundReason.CANCELLED)
    owed = await refunds(engine)
    assert [(r["payment_id"], r["reason"]) for r in owed] == [
        ("charge-1", "cancelled"),
        ("charge-2", "cancelled"),
    ]
    assert await engine.stock(1) == Stock(1, 1, 0, 0)
    await assert_audit_passes(engine)


async def test_a_second_charge_for_a_paid_order_is_a_refund_owed_once(
    engine: RedisEngine, redis: Redis
) -> None:
    """The buyer who double-clicks "pay": the provider charged twice; the order stays paid by
    the first, and the second is owed back, however often the provider repeats it."""
    await engine.load_item(open_item(total=3))
    order_id = await hold_one(engine)
    assert await pay(engine, 1, order_id, "pay-A") == PaymentSettlement(Outcome.PAID)
    answers = [await pay(engine, 1, order_id, "pay-B") for _ in range(3)]
    assert answers == [
        PaymentSettlement(Outcome.REFUND_REQUIRED, RefundReason.DUPLICATE_CHARGE, replayed=r)
        for r in (False, True, True)
    ]
    hold = await engine.hold(1, order_id)
    assert hold is not None
    assert (hold.state, hold.payment_id, hold.refund_required) == (HoldState.PAID, "pay-A", False)
    assert await journal(engine) == ["loaded", "reserved", "paid", "refund_required"]
    [owed] = await refunds(engine)
    assert (owed["payment_id"], owed["reason"], owed["order_id"]) == (
        "pay-B",
        "duplicate_charge",
        str(order_id),
    )
    assert await engine.stock(1) == Stock(3, 2, 0, 1)  # sold once
    assert (await payments(redis, engine))["pay-B"] == {
        "order_id": str(order_id),
        "succeeded": True,
        "amount": "0",
        "currency": "USD",
        "outcome": "refund_required",
        "reason": "duplicate_charge",
    }
    await assert_audit_passes(engine)


@EVERY_VARIANT
async def test_two_simultaneous_charges_for_one_order_are_a_sale_and_a_refund(
    engine: RedisEngine,
) -> None:
    await engine.load_item(open_item(total=50, stock_shards=1))
    for trial in range(10):
        order_id = await hold_one(engine, buyer=f"buyer-{trial}")
        answers = await asyncio.gather(
            pay(engine, 1, order_id, f"click-{trial}-1"),
            pay(engine, 1, order_id, f"click-{trial}-2"),
        )
        assert sorted(a.outcome for a in answers) == [Outcome.PAID, Outcome.REFUND_REQUIRED]
        assert {a.reason for a in answers} == {None, RefundReason.DUPLICATE_CHARGE}
    assert len(await refunds(engine)) == 10
    await assert_audit_passes(engine)


@EVERY_VARIANT
@pytest.mark.parametrize("homes", ["two other shards", "the head and another"])
async def test_one_payment_id_for_orders_on_two_shards_pays_one(
    engine: RedisEngine, homes: str
) -> None:
    """Two signed successes with one new payment id, for orders whose buyers live on different
    shards, sent at the same moment: exactly one pays, the other is refused, and each one's
    retries get its own first answer."""
    await engine.load_item(open_item(total=200, stock_shards=4))
    buyers_of: dict[int, list[str]] = {shard: [] for shard in range(4)}
    for n in range(400):
        buyers_of[home_shard(f"b{n}", 4)].append(f"b{n}")
    shards = (1, 2) if homes == "two other shards" else (0, 3)
    for trial in range(30):
        first, second = [await hold_one(engine, buyer=buyers_of[shard][trial]) for shard in shards]
        payment_id = f"pay-{trial}"
        answers = await asyncio.gather(
            pay(engine, 1, first, payment_id),
            pay(engine, 1, second, payment_id),
            return_exceptions=True,
        )
        paid = [order for order, a in zip((first, second), answers, strict=True)
                if isinstance(a, PaymentSettlement)]  # fmt: skip
        refused = [a for a in answers if isinstance(a, InvalidRequest)]
        assert len(paid) == 1 and len(refused) == 1, answers
        assert refused[0].code is ErrorCode.PAYMENT_ID_REUSED
        [winner] = paid
        loser = second if winner == first else first
        again = await pay(engine, 1, winner, payment_id)
        assert (again.outcome, again.replayed) == (Outcome.PAID, True)
        with pytest.raises(InvalidRequest) as still:
            await pay(engine, 1, loser, payment_id)
        assert still.value.code is ErrorCode.PAYMENT_ID_REUSED
        hold = await engine.hold(1, loser)
        assert hold is not None and hold.state is HoldState.HELD  # the refusal wrote nothing
    await assert_audit_passes(engine)


async def test_a_payment_past_the_deadline_releases_once_and_is_owed_back(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=1, hold_ms=1_000))
    order_id = await hold_one(timed_engine)
    clock.advance(1_000)  # the deadline itself is late; the reaper has not run yet

    late = await pay(timed_engine, 1, order_id)
    assert (late.outcome, late.reason) == (Outcome.REFUND_REQUIRED, RefundReason.EXPIRED)
    events = await timed_engine.events(1)
    assert [(f["event"], f.get("reason")) for _, f in events] == [
        ("loaded", None),
        ("reserved", None),
        ("released", "expired"),
        ("refund_required", "expired"),
    ]
    again = await pay(timed_engine, 1, order_id)
    assert (again.outcome, again.reason, again.replayed) == (
        Outcome.REFUND_REQUIRED,
        RefundReason.EXPIRED,
        True,
    )
    assert await timed_engine.expire_due(1) == []
    assert await timed_engine.events(1) == events  # nothing more written
    assert await timed_engine.stock(1) == Stock(1, 1, 0, 0)  # back once, never sold
    assert await timed_engine.buyer_units(1) == {}
    await assert_audit_passes(timed_engine)
    assert (
        await timed_engine.reserve(1, buyer="bob", quantity=1, idempotency_key="k", order_id=77)
    ).accepted


async def test_a_succeeded_notice_pays_and_its_repeat_is_a_replay(
    engine: RedisEngine, redis: Redis
) -> None:
    await engine.load_item(open_item(total=3))
    order_id = await hold_one(engine)
    first = await engine.settle_payment(
        1, order_id, payment_id="pay-1", succeeded=True, charged=FREE, unit_price=FREE
    )
    assert first == PaymentSettlement(Outcome.PAID)
    before = await state(redis, engine)
    again = await engine.settle_payment(
        1, order_id, payment_id="pay-1", succeeded=True, charged=FREE, unit_price=FREE
    )
    assert again == PaymentSettlement(Outcome.PAID, replayed=True)
    assert await state(redis, engine) == before
    assert await engine.stock(1) == Stock(3, 2, 0, 1)
    assert await payments(redis, engine) == {
        "pay-1": {
            "order_id": str(order_id),
            "succeeded": True,
            "amount": "0",
            "currency": "USD",
            "outcome": "paid",
        }
    }
    paid = await engine.events(1)
    assert paid[-1][1]["payment_id"] == "pay-1"  # the sale names its payment
    await assert_audit_passes(engine)


async def test_a_failed_notice_releases_and_its_repeat_is_a_replay(
    engine: RedisEngine, redis: Redis
) -> None:
    await engine.load_item(open_item(total=3))
    order_id = await hold_one(engine)
    first = await engine.settle_payment(
        1, order_id, payment_id="pay-1", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert first == PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED)
    before = await state(redis, engine)
    again = await engine.settle_payment(
        1, order_id, payment_id="pay-1", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert again == PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED, replayed=True)
    assert await state(redis, engine) == before
    assert await engine.stock(1) == Stock(3, 3, 0, 0)
    assert (await payments(redis, engine))["pay-1"] == {
        "order_id": str(order_id),
        "succeeded": False,
        "amount": "0",
        "currency": "USD",
        "outcome": "released",
        "reason": "payment_failed",
    }
    await assert_audit_passes(engine)


@pytest.mark.parametrize("change", ["order", "result", "amount", "currency"])
async def test_a_payment_id_reused_is_refused_and_writes_nothing(
    engine: RedisEngine, redis: Redis, change: str
) -> None:
    await engine.load_item(open_item(total=3))
    order_id, other = await hold_one(engine, "alice"), await hold_one(engine, "bob")
    await engine.settle_payment(
        1, order_id, payment_id="pay-1", succeeded=True, charged=FREE, unit_price=FREE
    )
    before = await state(redis, engine)
    with pytest.raises(InvalidRequest) as refused:
        await engine.settle_payment(
            1,
            other if change == "order" else order_id,
            payment_id="pay-1",
            succeeded=change != "result",
            charged={"amount": Money(1, "USD"), "currency": Money(0, "EUR")}.get(change, FREE),
            unit_price=FREE,
        )
    assert refused.value.code is ErrorCode.PAYMENT_ID_REUSED
    assert "pay-1" in refused.value.message
    assert await state(redis, engine) == before
    await assert_audit_passes(engine)


@EVERY_VARIANT
async def test_a_charge_for_an_unknown_order_is_one_refund_owed_of_its_sum(
    engine: RedisEngine, redis: Redis
) -> None:
    """A failure for an order nobody holds changes nothing; a success is money taken for it:
    a refund owed of the sum charged, naming no buyer, answered the same on every retry."""
    await engine.load_item(open_item(total=3))
    failed = await engine.settle_payment(
        1, 424242, payment_id="pay-0", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert failed == PaymentSettlement(Outcome.UNKNOWN_ORDER)
    assert await payments(redis, engine) == {}
    charged = Money(1250, "EUR")
    answers = [
        await engine.settle_payment(
            1, 424242, payment_id="pay-1", succeeded=True, charged=charged, unit_price=FREE
        )
        for _ in range(3)
    ]
    assert [(a.outcome, a.reason, a.replayed) for a in answers] == [
        (Outcome.REFUND_REQUIRED, RefundReason.UNKNOWN_ORDER, False),
        (Outcome.REFUND_REQUIRED, RefundReason.UNKNOWN_ORDER, True),
        (Outcome.REFUND_REQUIRED, RefundReason.UNKNOWN_ORDER, True),
    ]
    assert await refunds(engine) == [
        {
            "event": "refund_required", "item_id": "1", "order_id": "424242",
            "reason": "unknown_order", "payment_id": "pay-1", "amount": "1250", "currency": "EUR",
        }
    ]  # fmt: skip
    # The payment id is that charge's: it pays no other order.
    order_id = await hold_one(engine)
    with pytest.raises(InvalidRequest) as reused:
        await engine.settle_payment(
            1, order_id, payment_id="pay-1", succeeded=True, charged=charged, unit_price=FREE
        )
    assert reused.value.code is ErrorCode.PAYMENT_ID_REUSED
    await assert_audit_passes(engine)


@EVERY_VARIANT
@pytest.mark.parametrize(
    ("charged", "reason"),
    [
        (Money(1999, "EUR"), RefundReason.AMOUNT_MISMATCH),  # one cent short of 2 x 10.00
        (Money(2001, "EUR"), RefundReason.AMOUNT_MISMATCH),  # one cent over
        (Money(2000, "USD"), RefundReason.CURRENCY_MISMATCH),  # the sum, in another currency
    ],
)
async def test_a_wrong_sum_is_a_refund_owed_and_leaves_the_order_payable(
    engine: RedisEngine, redis: Redis, charged: Money, reason: RefundReason
) -> None:
    """Two units at 10.00 EUR: only 20.00 EUR pays. Any other charge is owed back in full, once,
    and the hold stays held: the right sum pays it after."""
    price = Money(1000, "EUR")
    await engine.load_item(open_item(total=3, limit=2))
    order_id = await hold_one(engine, quantity=2)
    for attempt in range(2):
        wrong = await engine.settle_payment(
            1, order_id, payment_id="wrong", succeeded=True, charged=charged, unit_price=price
        )
        assert wrong == PaymentSettlement(Outcome.REFUND_REQUIRED, reason, replayed=attempt > 0)
    hold = await engine.hold(1, order_id)
    assert hold is not None and hold.state is HoldState.HELD and not hold.refund_required
    assert await engine.stock(1) == Stock(3, 1, 2, 0)
    [refund] = await refunds(engine)
    assert (refund["reason"], refund["amount"], refund["currency"]) == (
        reason.value, str(charged.cents), charged.currency
    )  # fmt: skip
    right = await engine.settle_payment(
        1, order_id, payment_id="right", succeeded=True, charged=price.times(2), unit_price=price
    )
    assert right == PaymentSettlement(Outcome.PAID)
    assert await engine.stock(1) == Stock(3, 1, 0, 2)
    await assert_audit_passes(engine)


async def test_a_failure_then_a_success_is_a_refund_owed(engine: RedisEngine, redis: Redis) -> None:
    """Two attempts whose notices arrive out of order: the failed one first releases the hold,
    so the successful one cannot sell it any more: its money goes back."""
    await engine.load_item(open_item(total=1))
    order_id = await hold_one(engine)
    failed = await engine.settle_payment(
        1, order_id, payment_id="try-2", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert failed == PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED)
    paid = await engine.settle_payment(
        1, order_id, payment_id="try-1", succeeded=True, charged=FREE, unit_price=FREE
    )
    assert paid == PaymentSettlement(Outcome.REFUND_REQUIRED, RefundReason.PAYMENT_FAILED)
    assert await journal(engine) == ["loaded", "reserved", "released", "refund_required"]
    hold = await engine.hold(1, order_id)
    assert hold is not None and hold.refund_required and hold.state is HoldState.RELEASED
    assert await engine.stock(1) == Stock(1, 1, 0, 0)
    assert (await payments(redis, engine))["try-1"]["outcome"] == "refund_required"
    await assert_audit_passes(engine)


async def test_a_success_then_a_failure_stays_paid(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=1))
    order_id = await hold_one(engine)
    assert await engine.settle_payment(
        1, order_id, payment_id="try-1", succeeded=True, charged=FREE, unit_price=FREE
    ) == PaymentSettlement(Outcome.PAID)
    late_failure = await engine.settle_payment(
        1, order_id, payment_id="try-2", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert late_failure == PaymentSettlement(Outcome.ALREADY_PAID)
    hold = await engine.hold(1, order_id)
    assert hold is not None and hold.state is HoldState.PAID and not hold.refund_required
    assert await engine.stock(1) == Stock(1, 0, 0, 1)
    assert await journal(engine) == ["loaded", "reserved", "paid"]
    await assert_audit_passes(engine)


async def test_a_planted_payment_on_two_orders_is_found_and_named(
    engine: RedisEngine, redis: Redis
) -> None:
    await engine.load_item(open_item(total=3))
    first, second = await hold_one(engine, "alice"), await hold_one(engine, "bob")
    await pay(engine, 1, first, "pay-1")
    await pay(engine, 1, second, "pay-2")
    # A record edited by hand: pay-2 now says it paid the first order.
    record = {"order_id": str(first), "succeeded": True, "outcome": "paid"}  # no charge kept
    await redis.hset(engine.keys(1).payments, "pay-2", json.dumps(record))
    failed = {c.name: c.detail for c in await audit_item(engine, 1) if not c.ok}
    assert list(failed) == ["every charge accounted for"]
    assert "pay-2" in failed["every charge accounted for"]
    assert str(first) in failed["every charge accounted for"]


@pytest.mark.parametrize(
    ("payment_id", "succeeded", "code"),
    [
        ("", True, ErrorCode.INVALID_PAYMENT_ID),
        ("p" * 65, True, ErrorCode.INVALID_PAYMENT_ID),
        ("two words", False, ErrorCode.INVALID_PAYMENT_ID),
        ("pay-1", "failed", ErrorCode.INVALID_PAYMENT_RESULT),  # truthy, but not a bool
    ],
)
async def test_bad_notices_are_refused_before_redis(
    engine: RedisEngine, redis: Redis, payment_id: str, succeeded: Any, code: ErrorCode
) -> None:
    await engine.load_item(open_item(total=1))
    order_id = await hold_one(engine)
    before = await state(redis, engine)
    with pytest.raises(InvalidRequest) as refused:
        await engine.settle_payment(
            1, order_id, payment_id=payment_id, succeeded=succeeded, charged=FREE, unit_price=FREE
        )
    assert refused.value.code is code
    assert await state(redis, engine) == before
