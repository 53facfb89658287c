"""Orders as a buyer or the payment provider sees them: one view, wherever the order lives.

An order is decided in Redis (its hold) and landed in SQL moments later. Redis holds the live
state (a hold record stays with its item after it settles), so it answers first; SQL answers for
an order Redis no longer has (lost with a Redis that restarted empty, until recovery).
"""

from __future__ import annotations

from dataclasses import dataclass

from seckill.domain import rules
from seckill.domain.events import ReleaseReason
from seckill.domain.holds import Hold, HoldTransition, PaymentSettlement
from seckill.domain.orders import OrderStatus
from seckill.domain.times import datetime_to_ms
from seckill.engine.cluster import RedisClient
from seckill.engine.engine import RedisEngine
from seckill.store.ledger import Ledger


class OrderNotFound(LookupError):
    """No such order, or not this buyer's: the two look the same from outside."""


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
    """Finds orders by id and moves them: cancel, and the payment provider's notices."""

    def __init__(self, *, redis: RedisClient, engine: RedisEngine, ledger: Ledger) -> None:
        self._redis = redis
        self._engine = engine
        self._ledger = ledger
        self._item_of: dict[int, int] = {}  # order id -> item id: a hold never moves

    async def find(self, order_id: int) -> OrderView | None:
        rules.check_order_id(order_id)
        item_id = await self._item_in_redis(order_id)
        if item_id is not None:
            hold = await self._engine.hold(item_id, order_id)
            if hold is not None:
                return _from_hold(item_id, hold)
        landed = await self._ledger.order(order_id)
        if landed is None:
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

    async def buyers_order(self, buyer: str, order_id: int) -> OrderView:
        """The order, if it is this buyer's; OrderNotFound otherwise (never a hint it exists)."""
        view = await self.find(order_id)
        if view is None or view.buyer != buyer:
            raise OrderNotFound(f"no order {order_id}")
        return view

    async def cancel(self, buyer: str, order_id: int) -> tuple[HoldTransition, OrderView]:
        """The buyer gives the hold back. Idempotent; a paid order answers ``already_paid``."""
        view = await self.buyers_order(buyer, order_id)
        transition = await self._engine.release(view.item_id, order_id, ReleaseReason.CANCELLED)
        return transition, await self.buyers_order(buyer, order_id)

    async def settle_payment(
        self, order_id: int, *, payment_id: str, succeeded: bool
    ) -> tuple[PaymentSettlement, OrderView]:
        """Apply one provider notice (once per payment id); OrderNotFound for an unknown order."""
        rules.check_order_id(order_id)
        rules.check_payment_id(payment_id)
        item_id = await self._item_in_redis(order_id)
        if item_id is None:
            raise OrderNotFound(f"no order {order_id}")
        settlement = await self._engine.settle_payment(
            item_id, order_id, payment_id=payment_id, succeeded=succeeded
        )
        view = await self.find(order_id)
        if view is None:
            raise OrderNotFound(f"no order {order_id}")
        return settlement, view

    async def _item_in_redis(self, order_id: int) -> int | None:
        """Which item's holds name this order: one pipelined look into every registered item.

        Order ids carry no item, and each item's keys live in their own slot; a sale has few
        items live at once, and a hold never moves, so the answer is remembered.
        """
        known = self._item_of.get(order_id)
        if known is not None:
            return known
        item_ids = await self._engine.item_ids()
        if not item_ids:
            return None
        async with self._redis.pipeline(transaction=False) as pipe:
            for item_id in item_ids:
                pipe.hexists(self._engine.keys(item_id).holds, str(order_id))
            found = await pipe.execute()
        for item_id, present in zip(item_ids, found, strict=True):
            if present:
                if len(self._item_of) >= _REMEMBERED_ORDERS:
                    self._item_of.clear()  # crude but bounded; a miss costs one round trip
                self._item_of[order_id] = item_id
                return item_id
        return None


_REMEMBERED_ORDERS = 100_000
