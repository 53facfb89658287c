"""Orders as a buyer or the payment provider sees them: one view, wherever the order lives.

An order is decided in Redis (its hold) and landed in SQL moments later. Redis holds the live
state (a hold record stays with its item after it settles), so it answers first; SQL answers for
an order Redis no longer has: its item archived (SQL is then its whole record, payment notices
included), or lost with a Redis that restarted empty (until recovery).

An order answered 202 that Redis lost before it landed (``fast`` durability) is in neither, and
its item was rebuilt from SQL without it: a buyer who reads it is told so (``OrderLost``), from
what SQL keeps of the item (the rebuild's time in the ``repairs`` journal), read only then.

Every lookup names the item as well as the order (the buyer's URL, the payment notice): the
hold is then one read in that item's keys, on the one node of a cluster that holds them, and
never a search through every item. An order asked under another item is not found.
"""

from __future__ import annotations

from dataclasses import dataclass

from seckill.domain import rules
from seckill.domain.events import ReleaseReason
from seckill.domain.holds import Hold, HoldTransition, PaymentSettlement
from seckill.domain.ids import issued_at_ms
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import Outcome
from seckill.domain.times import datetime_to_ms
from seckill.engine.engine import RedisEngine
from seckill.services.landings import Answered, Landings
from seckill.services.reconcile.recovery import REBUILT_KINDS, REBUILT_SUBJECT
from seckill.store.ledger import Ledger


class OrderNotFound(LookupError):
    """No such order, or not this buyer's: the two look the same from outside."""


class OrderLost(LookupError):
    """An order this deployment issued and lost: answered 202, then lost with the last writes
    of a Redis that went back before SQL had it. Its units are back on sale and the buyer's
    limit no longer counts it. Nobody knows whose it was, so it is said to any buyer who asks."""


class NotLanded(Exception):
    """A payment notice did its work in Redis, but SQL (the record) did not hold it within the
    wait: nothing is said to the provider yet. Its retry replays the same answer from Redis, and
    is answered once SQL holds it."""


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

    def __init__(
        self, *, engine: RedisEngine, ledger: Ledger, landing_timeout_s: float = 5.0
    ) -> None:
        self._engine = engine
        self._ledger = ledger
        self._landings = Landings(ledger.payments)
        self._landing_timeout_s = landing_timeout_s
        # Each item's unit price, read from SQL once: an item's price and currency are set when
        # it is created and never change, so a notice asks SQL nothing while its hold is there.
        self._prices: dict[int, Money] = {}

    async def find(self, item_id: int, order_id: int) -> OrderView | None:
        view, _ = await self._look(item_id, order_id)
        return view

    async def buyers_order(self, buyer: str, item_id: int, order_id: int) -> OrderView:
        """The order, if it is this buyer's; OrderNotFound otherwise (never a hint it exists).
        OrderLost for one Redis lost before SQL had it, whoever asks: its buyer is lost with it,
        and the answer says only that the id was issued before the item was rebuilt."""
        view, anywhere = await self._look(item_id, order_id)
        if view is None and not anywhere and await self._lost(item_id, order_id):
            raise OrderLost(
                f"order {order_id} of item {item_id} was lost: the store lost its last writes "
                "before the database had the order. Its units are back on sale and the "
                "per-buyer limit no longer counts it: you may buy again while the sale lasts"
            )
        if view is None or view.buyer != buyer:
            raise OrderNotFound(f"no order {order_id} of item {item_id}")
        return view

    async def _look(self, item_id: int, order_id: int) -> tuple[OrderView | None, bool]:
        """The order under ``item_id``, and whether Redis or SQL has an order of that id at
        all (SQL may have it under another item)."""
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        hold = await self._engine.hold(item_id, order_id)
        if hold is not None:
            return _from_hold(item_id, hold), True
        landed = await self._ledger.order(order_id)
        if landed is None or landed.item_id != item_id:
            return None, landed is not None
        view = OrderView(
            order_id=landed.order_id,
            item_id=landed.item_id,
            buyer=landed.buyer,
            quantity=landed.quantity,
            status=landed.status,
            release_reason=landed.release_reason,
            pay_before_ms=datetime_to_ms(landed.deadline_at) if landed.deadline_at else None,
        )
        return view, True

    async def _lost(self, item_id: int, order_id: int) -> bool:
        """Whether an order neither Redis nor SQL has was issued and lost: the item, not
        archived, was rebuilt from SQL (Redis had lost writes) after the id's time, and the id
        is no older than the item. An order lost is always older than the rebuild that followed
        its loss: an id newer than the last one (or of an item never rebuilt) was not issued,
        or its loss is not rebuilt yet, and reads as unknown until it is."""
        item = await self._ledger.rebuilt(item_id, subject=REBUILT_SUBJECT, kinds=REBUILT_KINDS)
        if item is None or item.archived_at is not None or item.rebuilt_at is None:
            return False
        issued = issued_at_ms(order_id)
        return datetime_to_ms(item.created_at) <= issued < datetime_to_ms(item.rebuilt_at)

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
        self, item_id: int, order_id: int, *, payment_id: str, succeeded: bool, charged: Money
    ) -> tuple[PaymentSettlement, OrderView | None]:
        """Apply one provider notice (once per payment id): ``charged`` is what the provider
        took, which pays the order only if it is the order's sum (the item's price, from SQL,
        times its quantity). A success that pays nothing is a refund owed of the sum charged,
        for an order nobody knows too (the view is then None). OrderNotFound for a failure
        notice of an order the item does not hold, or an item SQL does not know (nothing is
        then recorded). An archived item's notices are settled in SQL, with the same answers.

        The provider acts on the answer and never sends it again, so it is given only once SQL
        holds what it says (``_landed``): Redis may lose its last writes, SQL is the record, and
        recovery gives back to Redis every payment SQL holds. NotLanded if SQL does not within
        ``landing_timeout_s``."""
        unit_price = await self._unit_price(item_id)

        async def settle(landed: bool | None) -> PaymentSettlement:
            return await self._engine.settle_payment(
                item_id, order_id, payment_id=payment_id, succeeded=succeeded, charged=charged,
                unit_price=unit_price, landed=landed,
            )  # fmt: skip

        # An order SQL holds is never unknown: if no shard holds it, Redis lost it (a rewind, a
        # failover) and recovery gives it back, so the charge waits for it. SQL is asked only
        # when no shard holds the order (the script then records nothing until told).
        settlement = await settle(None)
        if (
            settlement.outcome is Outcome.UNKNOWN_ORDER
            and succeeded
            and not await self._landed_here(item_id, order_id)
        ):
            settlement = await settle(False)
        if settlement.outcome is Outcome.ITEM_RECOVERING:
            raise ItemRecovering(f"item {item_id} is being checked against SQL")
        if settlement.outcome is not Outcome.UNKNOWN_ORDER:
            await self._until_landed(item_id, order_id, payment_id, settlement)
            return settlement, await self.find(item_id, order_id)
        # Redis answers a failure for an order it does not hold, a success for one SQL holds
        # and it lost, and any notice for an item it does not hold: an archived one's are SQL's
        # to settle; any other's wait for Redis to be rebuilt or the item put on sale.
        if await self._archived(item_id):
            archived = await self._ledger.payments.settle_archived(
                item_id, order_id, payment_id=payment_id, succeeded=succeeded, charged=charged
            )
            if archived is not None:
                return archived, await self.find(item_id, order_id)
        elif succeeded:
            raise ItemRecovering(f"order {order_id} of item {item_id} is not in Redis now")
        raise OrderNotFound(f"no order {order_id} of item {item_id}")

    async def _until_landed(
        self, item_id: int, order_id: int, payment_id: str, settlement: PaymentSettlement
    ) -> None:
        """Wait for SQL to hold what ``settlement`` says (see ``services.landings``)."""
        answered = Answered.of(item_id, order_id, payment_id, settlement)
        if not await self._landings.held(answered, timeout_s=self._landing_timeout_s):
            raise NotLanded(
                f"payment {payment_id} of order {order_id} is not in the database yet "
                f"(waited {self._landing_timeout_s:g} s): send the notice again"
            )

    async def _unit_price(self, item_id: int) -> Money:
        price = self._prices.get(item_id)
        if price is None:
            item = await self._ledger.item(item_id)
            if item is None:
                raise OrderNotFound(f"no item {item_id}, so no order of it")
            price = self._prices[item_id] = Money(item.price_cents, item.currency)
        return price

    async def _landed_here(self, item_id: int, order_id: int) -> bool:
        landed = await self._ledger.order(order_id)
        return landed is not None and landed.item_id == item_id

    async def _archived(self, item_id: int) -> bool:
        return await self._ledger.archived_at(item_id) is not None
