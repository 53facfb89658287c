"""Payments against a real Redis: late payments become refunds, provider notices apply once.

One Redis version is enough here: the scripts use nothing that differs between 6.2 and 7, and
test_engine_model.py drives confirm and settle_payment on both.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from seckill.domain.events import ReleaseReason
from seckill.domain.holds import HoldState, PaymentSettlement
from seckill.domain.ids import OrderIds
from seckill.domain.items import Stock
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from tests.conftest import ManualClock, open_item

pytestmark = pytest.mark.redis_variants("redis7")

ids = OrderIds(6)


async def hold_one(engine: RedisEngine, buyer: str = "alice", quantity: int = 1) -> int:
    answer = await engine.reserve(
        1, buyer=buyer, quantity=quantity, idempotency_key="k", order_id=ids.next()
    )
    assert answer.accepted and answer.order_id is not None
    return answer.order_id


async def journal(engine: RedisEngine) -> list[str]:
    return [fields["event"] for _, fields in await engine.events(1)]


async def payments(redis: Redis, engine: RedisEngine) -> dict[str, dict[str, Any]]:
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


async def test_a_payment_after_a_cancel_requires_one_refund(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=2, limit=2))
    order_id = await hold_one(engine, quantity=2)
    await engine.release(1, order_id, ReleaseReason.CANCELLED)
    stock_after_release = await engine.stock(1)

    answers = [await engine.confirm(1, order_id) for _ in range(3)]
    assert {(a.outcome, a.reason) for a in answers} == {
        (Outcome.REFUND_REQUIRED, ReleaseReason.CANCELLED)
    }
    assert await journal(engine) == ["loaded", "reserved", "released", "refund_required"]
    _, refund = (await engine.events(1))[-1]
    assert {k: v for k, v in refund.items() if k != "at_ms"} == {
        "event": "refund_required",
        "item_id": "1",
        "order_id": str(order_id),
        "buyer": "alice",
        "quantity": "2",
        "reason": "cancelled",
    }
    hold = await engine.hold(1, order_id)
    assert hold is not None
    assert (hold.state, hold.reason, hold.refund_required) == (
        HoldState.RELEASED,
        ReleaseReason.CANCELLED,
        True,
    )
    assert await engine.stock(1) == stock_after_release == Stock(2, 2, 0, 0)
    await assert_audit_passes(engine)


async def test_a_payment_past_the_deadline_releases_once_and_requires_a_refund(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=1, hold_ms=1_000))
    order_id = await hold_one(timed_engine)
    clock.advance(1_000)  # the deadline itself is late; the reaper has not run yet

    late = await timed_engine.confirm(1, order_id)
    assert (late.outcome, late.reason) == (Outcome.REFUND_REQUIRED, ReleaseReason.EXPIRED)
    events = await timed_engine.events(1)
    assert [(f["event"], f.get("reason")) for _, f in events] == [
        ("loaded", None),
        ("reserved", None),
        ("released", "expired"),
        ("refund_required", "expired"),
    ]
    again = await timed_engine.confirm(1, order_id)
    assert (again.outcome, again.reason) == (Outcome.REFUND_REQUIRED, ReleaseReason.EXPIRED)
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
    first = await engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=True)
    assert first == PaymentSettlement(Outcome.PAID)
    before = await state(redis, engine)
    again = await engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=True)
    assert again == PaymentSettlement(Outcome.PAID, replayed=True)
    assert await state(redis, engine) == before
    assert await engine.stock(1) == Stock(3, 2, 0, 1)
    assert await payments(redis, engine) == {
        "pay-1": {"order_id": str(order_id), "succeeded": True, "outcome": "paid"}
    }
    await assert_audit_passes(engine)


async def test_a_failed_notice_releases_and_its_repeat_is_a_replay(
    engine: RedisEngine, redis: Redis
) -> None:
    await engine.load_item(open_item(total=3))
    order_id = await hold_one(engine)
    first = await engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=False)
    assert first == PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED)
    before = await state(redis, engine)
    again = await engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=False)
    assert again == PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED, replayed=True)
    assert await state(redis, engine) == before
    assert await engine.stock(1) == Stock(3, 3, 0, 0)
    assert (await payments(redis, engine))["pay-1"] == {
        "order_id": str(order_id),
        "succeeded": False,
        "outcome": "released",
        "reason": "payment_failed",
    }
    await assert_audit_passes(engine)


@pytest.mark.parametrize("change", ["order", "result"])
async def test_a_payment_id_reused_is_refused_and_writes_nothing(
    engine: RedisEngine, redis: Redis, change: str
) -> None:
    await engine.load_item(open_item(total=3))
    order_id, other = await hold_one(engine, "alice"), await hold_one(engine, "bob")
    await engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=True)
    before = await state(redis, engine)
    with pytest.raises(InvalidRequest) as refused:
        await engine.settle_payment(
            1,
            other if change == "order" else order_id,
            payment_id="pay-1",
            succeeded=change == "order",
        )
    assert refused.value.code is ErrorCode.PAYMENT_ID_REUSED
    assert "pay-1" in refused.value.message
    assert await state(redis, engine) == before
    await assert_audit_passes(engine)


async def test_an_unknown_order_is_answered_and_not_recorded(
    engine: RedisEngine, redis: Redis
) -> None:
    await engine.load_item(open_item(total=3))
    unknown = await engine.settle_payment(1, 424242, payment_id="pay-1", succeeded=True)
    assert unknown == PaymentSettlement(Outcome.UNKNOWN_ORDER)
    assert await payments(redis, engine) == {}
    # Not recorded, so the payment id is still free for the order it really belongs to.
    order_id = await hold_one(engine)
    paid = await engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=True)
    assert paid == PaymentSettlement(Outcome.PAID)
    await assert_audit_passes(engine)


async def test_a_failure_then_a_success_requires_a_refund(
    engine: RedisEngine, redis: Redis
) -> None:
    """Two attempts whose notices arrive out of order: the failed one first releases the hold,
    so the successful one cannot sell it any more."""
    await engine.load_item(open_item(total=1))
    order_id = await hold_one(engine)
    failed = await engine.settle_payment(1, order_id, payment_id="try-2", succeeded=False)
    assert failed == PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED)
    paid = await engine.settle_payment(1, order_id, payment_id="try-1", succeeded=True)
    assert paid == PaymentSettlement(Outcome.REFUND_REQUIRED, ReleaseReason.PAYMENT_FAILED)
    # confirm and settle_payment share the decision: the refund is journaled once between them.
    confirmed = await engine.confirm(1, order_id)
    assert (confirmed.outcome, confirmed.reason) == (
        Outcome.REFUND_REQUIRED,
        ReleaseReason.PAYMENT_FAILED,
    )
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
        1, order_id, payment_id="try-1", succeeded=True
    ) == PaymentSettlement(Outcome.PAID)
    late_failure = await engine.settle_payment(1, order_id, payment_id="try-2", succeeded=False)
    assert late_failure == PaymentSettlement(Outcome.ALREADY_PAID)
    hold = await engine.hold(1, order_id)
    assert hold is not None and hold.state is HoldState.PAID and not hold.refund_required
    assert await engine.stock(1) == Stock(1, 0, 0, 1)
    assert await journal(engine) == ["loaded", "reserved", "paid"]
    await assert_audit_passes(engine)


async def test_a_succeeded_notice_past_the_deadline_requires_a_refund(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=1, hold_ms=1_000))
    order_id = await hold_one(timed_engine)
    clock.advance(1_500)
    late = await timed_engine.settle_payment(1, order_id, payment_id="pay-1", succeeded=True)
    assert late == PaymentSettlement(Outcome.REFUND_REQUIRED, ReleaseReason.EXPIRED)
    assert await journal(timed_engine) == ["loaded", "reserved", "released", "refund_required"]
    assert await timed_engine.stock(1) == Stock(1, 1, 0, 0)
    await assert_audit_passes(timed_engine)


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
        await engine.settle_payment(1, order_id, payment_id=payment_id, succeeded=succeeded)
    assert refused.value.code is code
    assert await state(redis, engine) == before
