"""What SQL must hold before a payment notice's answer is given (``Answered.held_by``)."""

from __future__ import annotations

import pytest

from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import Outcome
from seckill.services.landings import Answered
from seckill.store.payments import Settled

ITEM, ORDER, PAYMENT = 7, 42, "pay-1"


def sql(status: OrderStatus | None, payment_id: str | None = None, *, item: int = ITEM) -> Settled:
    orders = {} if status is None else {ORDER: (item, status, payment_id)}
    return Settled(orders, set())


@pytest.mark.parametrize(
    ("outcome", "status", "paid_by", "held"),
    [
        (Outcome.PAID, OrderStatus.PAID, PAYMENT, True),
        (Outcome.PAID, OrderStatus.PAID, "pay-2", False),  # another payment paid it
        (Outcome.PAID, OrderStatus.HELD, None, False),  # the paid event not landed yet
        (Outcome.PAID, None, None, False),  # the order not landed yet
        (Outcome.ALREADY_PAID, OrderStatus.PAID, "pay-2", True),
        (Outcome.ALREADY_PAID, OrderStatus.HELD, None, False),
        (Outcome.RELEASED, OrderStatus.RELEASED, None, True),
        (Outcome.RELEASED, OrderStatus.HELD, None, False),
        (Outcome.ALREADY_RELEASED, OrderStatus.REFUND_REQUIRED, None, True),
        (Outcome.ALREADY_RELEASED, OrderStatus.PAID, PAYMENT, False),
    ],
)
def test_an_answer_about_the_order_waits_for_that_state_in_sql(
    outcome: Outcome, status: OrderStatus | None, paid_by: str | None, held: bool
) -> None:
    assert Answered(ITEM, ORDER, PAYMENT, outcome).held_by(sql(status, paid_by)) is held


def test_an_order_of_another_item_holds_nothing() -> None:
    answered = Answered(ITEM, ORDER, PAYMENT, Outcome.PAID)
    assert not answered.held_by(sql(OrderStatus.PAID, PAYMENT, item=ITEM + 1))


def test_a_refund_owed_waits_for_its_own_row() -> None:
    answered = Answered(ITEM, ORDER, PAYMENT, Outcome.REFUND_REQUIRED)
    assert not answered.held_by(sql(OrderStatus.REFUND_REQUIRED))  # the order alone: not yet
    assert answered.held_by(Settled({}, {(ITEM, PAYMENT)}))
    assert not answered.held_by(Settled({}, {(ITEM + 1, PAYMENT)}))


def test_an_answer_no_notice_gives_is_refused() -> None:
    with pytest.raises(ValueError, match="does not answer"):
        Answered(ITEM, ORDER, PAYMENT, Outcome.RESERVED).held_by(sql(OrderStatus.HELD))
