"""Orders as a buyer or the payment provider sees them: one view, wherever the order lives.

An order is decided in Redis (its hold) and landed in SQL moments later. Redis holds the live
state (a hold record stays with its item after it settles), so it answers first; SQL answers for
an order Redis no longer has: its item archived (SQL is then its whole record, payment notices
included), or lost with a Redis that restarted empty (until recovery).

Every lookup names the item as well as the order (the buyer's URL, the payment notice): the
hold is then one read in that item's keys, on the one node of a cluster that holds them, and
never a search through every item. An order asked under another item is not found.
"""

from __future__ import annotations

from dataclasses import dataclass

from seckill.domain import rules
from seckill.domain.events import ReleaseReason
from seckill.domain.holds import Hold, HoldTransition, PaymentSettlement
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import Outcome
from seckill.domain.times import datetime_to_ms
from seckill.engine.engine import RedisEngine
from seckill.store.ledger import Ledger


class OrderNotFound(LookupError):
    """No such order, or not this buyer's: the two look the same from outside."""


class ItemRecovering(Exception):
    """The order's stock shard is fenced (Redis restarted, or lost writes) until it is checked
    against SQL: the notice or the cancel is to be sent again shortly."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderView:
    order_id: int
    item_id: int
    buyer: str
    quantity: int
    status: OrderStatus
    release_reason: str | None
    pay_before_ms: int | None


def _from_hold(item_id: int, hold: Hold) -> OrderView:
    return OrderView(
        order_id=hold.order_id,
        item_id=item_id,
        buyer=hold.buyer,
        quantity=hold.quantity,
        status=hold.order_status,
        release_reason=hold.reason.value if hold.reason else None,
        pay_before_ms=hold.deadline_ms,
    )


class OrderBook:
    """Finds orders by item and id and moves them: cancel, and the payment provider's notices."""

    def __init__(self, *, engine: RedisEngine, ledger: Ledger) -> None:
        self._engine = engine
        self._ledger = ledger

    async def find(self, item_id: int, order_id: int) -> OrderView | None:
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        hold = await self._engine.hold(item_id, order_id)
        if hold is not None:
            return _from_hold(item_id, hold)
        landed = await self._ledger.order(order_id)
        if landed is None or landed.item_id != item_id:
            return None
        return OrderView(
            order_id=landed.order_id,
            item_id=landed.item_id,
            buyer=landed.buyer,
            quantity=landed.quantity,
            status=landed.status,
            release_reason=landed.release_reason,
            pay_before_ms=datetime_to_ms(landed.deadline_at) if landed.deadline_at else None,
        )

    async def buyers_order(self, buyer: str, item_id: int, order_id: int) -> OrderView:
        """The order, if it is this buyer's; OrderNotFound otherwise (never a hint it exists)."""
        view = await self.find(item_id, order_id)
        if view is None or view.buyer != buyer:
            raise OrderNotFound(f"no order {order_id} of item {item_id}")
        return view

    async def cancel(
        self, buyer: str, item_id: int, order_id: int
    ) -> tuple[HoldTransition, OrderView]:
        """The buyer gives the hold back. Idempotent; a paid order answers ``already_paid``.
        An archived item's orders are all paid or released: answered from SQL."""
        view = await self.buyers_order(buyer, item_id, order_id)
        transition = await self._engine.release(item_id, order_id, ReleaseReason.CANCELLED)
        if transition.outcome is Outcome.ITEM_RECOVERING:
            raise ItemRecovering(f"item {item_id} is being checked against SQL")
        if transition.outcome is Outcome.UNKNOWN_ORDER and await self._archived(item_id):
            if view.status is OrderStatus.PAID:
                return HoldTransition(Outcome.ALREADY_PAID), view
            reason = ReleaseReason(view.release_reason) if view.release_reason else None
            return HoldTransition(Outcome.ALREADY_RELEASED, reason), view
        return transition, await self.buyers_order(buyer, item_id, order_id)

    async def settle_payment(
        self, item_id: int, order_id: int, *, payment_id: str, succeeded: bool
    ) -> tuple[PaymentSettlement, OrderView]:
        """Apply one provider notice (once per payment id); OrderNotFound for an order whose
        hold the item does not hold (nothing is then recorded). An archived item's notices are
        settled in SQL, with the same answers (a success for a released order is
        ``refund_required``: it is never accepted as paid)."""
        settlement: PaymentSettlement | None = await self._engine.settle_payment(
            item_id, order_id, payment_id=payment_id, succeeded=succeeded
        )
        if settlement is not None and settlement.outcome is Outcome.ITEM_RECOVERING:
            raise ItemRecovering(f"item {item_id} is being checked against SQL")
        if settlement is not None and settlement.outcome is Outcome.UNKNOWN_ORDER:
            settlement = None
            if await self._archived(item_id):
                settlement = await self._ledger.payments.settle_archived(
                    item_id, order_id, payment_id=payment_id, succeeded=succeeded
                )
        view = None if settlement is None else await self.find(item_id, order_id)
        if settlement is None or view is None:
            raise OrderNotFound(f"no order {order_id} of item {item_id}")
        return settlement, view

    async def _archived(self, item_id: int) -> bool:
        return await self._ledger.archived_at(item_id) is not None
