"""Money in SQL: the refunds owed, and the payment notices of archived items.

A refund owed is landed from its `refund_required` event (``landing``), one per payment; an
operator lists them and marks each refunded once the money is given back. Payment notices live
in Redis while their item is on sale; archiving moves them here (``keep``), and a notice that
comes later for an archived item is settled here, with the answers Redis would give
(``settle_archived``). A payment id names one payment of its item, here as in Redis.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain.events import ORDER_KEPT, EventKind, RefundReason, ReleaseReason
from seckill.domain.holds import PaymentSettlement
from seckill.domain.money import Money, RefundState
from seckill.domain.orders import RELEASED_STATUSES, OrderStatus
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.shards import home_shard
from seckill.domain.times import datetime_to_ms
from seckill.store.records import PaymentRecord, RefundRecord
from seckill.store.tables import Item, Order, Payment, Refund, StockFlow

LOOKUP_CHUNK = 500  # payment ids per statement (an IN list the servers plan well)


@dataclass(frozen=True, slots=True)
class RefundPage:
    """Refunds, newest first, and the cursor of the next (older) page: None when none is left."""

    refunds: list[RefundRecord]
    next_cursor: int | None


@dataclass(frozen=True, slots=True)
class Owed:
    """Refunds still owed: how many, and how much in each currency (minor units; a charge in
    another currency than its item's is owed back in its own)."""

    count: int
    amounts: dict[str, int]


@dataclass(frozen=True, slots=True)
class Settled:
    """What SQL holds of some orders and refunds owed (``Payments.settled``)."""

    orders: dict[int, tuple[int, OrderStatus, str | None]]  # id -> (item, status, payment id)
    refunds: set[tuple[int, str]]  # (item id, payment id) of the refunds owed found


class Payments:
    """The money query family of the ledger (``Ledger.payments``)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def refunds(
        self,
        *,
        item_id: int | None = None,
        state: RefundState | None = None,
        before: int | None = None,
        limit: int = 100,
    ) -> RefundPage:
        """Refunds, newest first (by id), of one item or every one, owed or refunded or both;
        ``before``: the cursor a previous page gave."""
        query = select(Refund).order_by(Refund.id.desc()).limit(limit + 1)
        if item_id is not None:
            query = query.where(Refund.item_id == item_id)
        if state is RefundState.OWED:
            query = query.where(Refund.refunded_at.is_(None))
        elif state is RefundState.REFUNDED:
            query = query.where(Refund.refunded_at.is_not(None))
        if before is not None:
            query = query.where(Refund.id < before)
        async with self.engine.connect() as conn:
            rows = [refund_record(row) for row in await conn.execute(query)]
        more = len(rows) > limit
        return RefundPage(rows[:limit], rows[limit - 1].id if more else None)

    async def refund(self, item_id: int, payment_id: str) -> RefundRecord | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(Refund).where(Refund.item_id == item_id, Refund.payment_id == payment_id)
                )
            ).first()
        return None if row is None else refund_record(row)

    async def mark_refunded(self, item_id: int, payment_id: str) -> RefundRecord | None:
        """The money of this refund was given back: marked once (a second mark keeps the first
        time). None: no refund is owed for that payment."""
        async with self.engine.begin() as conn:
            await conn.execute(
                update(Refund)
                .where(
                    Refund.item_id == item_id,
                    Refund.payment_id == payment_id,
                    Refund.refunded_at.is_(None),
                )
                .values(refunded_at=datetime.now(UTC))
            )
        return await self.refund(item_id, payment_id)

    async def owed(self, item_ids: Sequence[int]) -> dict[int, Owed]:
        """The refunds still owed of each item (one statement; items with none are left out)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(Refund.item_id, Refund.currency, func.count(), func.sum(Refund.amount_cents))
                .where(Refund.item_id.in_(item_ids), Refund.refunded_at.is_(None))
                .group_by(Refund.item_id, Refund.currency)
            )
            by_item: dict[int, list[Any]] = {}
            for item_id, *per_currency in rows:
                by_item.setdefault(item_id, []).append(per_currency)
            return {item_id: _owed(sums) for item_id, sums in by_item.items()}

    async def owed_in_all(self) -> Owed:
        """The refunds still owed over every item, archived ones included (one statement)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(Refund.currency, func.count(), func.sum(Refund.amount_cents))
                .where(Refund.refunded_at.is_(None))
                .group_by(Refund.currency)
            )
            return _owed(rows.all())

    async def settled(
        self, order_ids: Collection[int], refunds: Collection[tuple[int, str]]
    ) -> Settled:
        """What SQL holds of some orders and refunds owed (``refunds``: (item id, payment id)),
        one statement each, for the payment notices waiting for it (``services.landings``)."""
        orders: dict[int, tuple[int, OrderStatus, str | None]] = {}
        owed: set[tuple[int, str]] = set()
        async with self.engine.connect() as conn:
            if order_ids:
                rows = await conn.execute(
                    select(Order.id, Order.item_id, Order.status, Order.payment_id).where(
                        Order.id.in_(order_ids)
                    )
                )
                orders = {r.id: (r.item_id, OrderStatus(r.status), r.payment_id) for r in rows}
            if refunds:
                rows = await conn.execute(
                    select(Refund.item_id, Refund.payment_id).where(
                        tuple_(Refund.item_id, Refund.payment_id).in_(list(refunds))
                    )
                )
                owed = {(r.item_id, r.payment_id) for r in rows}
        return Settled(orders, owed)

    async def charged_on(self, payment_ids: Collection[str]) -> dict[str, set[tuple[int, int]]]:
        """Each payment id's charges over every item, as (item id, order id): the order it paid,
        the refund owed for it, an archived item's successful notice. Payment ids are scoped
        per item and a provider's are global, so one charge on two items shows both."""
        found: dict[str, set[tuple[int, int]]] = {}
        wanted = sorted(payment_ids)
        sources = (
            (Order.payment_id, Order.item_id, Order.id),
            (Refund.payment_id, Refund.item_id, Refund.order_id),
            (Payment.payment_id, Payment.item_id, Payment.order_id),
        )
        async with self.engine.connect() as conn:
            for at in range(0, len(wanted), LOOKUP_CHUNK):
                chunk = wanted[at : at + LOOKUP_CHUNK]
                for payment_id, item_id, order_id in sources:
                    query = select(payment_id, item_id, order_id).where(payment_id.in_(chunk))
                    if payment_id is Payment.payment_id:
                        query = query.where(Payment.succeeded.is_(True))
                    for pid, item, order in await conn.execute(query):
                        found.setdefault(str(pid), set()).add((item, order))
        return found

    async def keep(self, item_id: int, payments: Sequence[PaymentRecord]) -> None:
        """Record an item's payment notices (one already recorded keeps its first answer)."""
        async with self.engine.begin() as conn:
            await keep_payments(conn, item_id, payments)

    async def settle_archived(
        self, item_id: int, order_id: int, *, payment_id: str, succeeded: bool, charged: Money
    ) -> PaymentSettlement | None:
        """A payment notice for an order of an archived item, answered as settle_payment.lua
        answers one in Redis: a payment id seen before gets its first answer (or refuses with
        ``payment_id_reused``); a success that pays nothing (not the order's sum, the order
        released or paid by another payment, or no such order) is a refund owed of the sum
        charged, recorded with its journal row (no stock moves: the order was never sold); a
        paid order stays paid. None: a failure for an order the item does not have (nothing
        recorded)."""
        async with self.engine.begin() as conn:
            await _lock_item(conn, item_id)
            seen = (
                await conn.execute(
                    select(Payment).where(
                        Payment.item_id == item_id, Payment.payment_id == payment_id
                    )
                )
            ).first()
            if seen is not None:
                return _replayed(payment_record(seen), order_id, succeeded, charged)
            item = (
                await conn.execute(
                    select(Item.price_cents, Item.currency, Item.stock_shards).where(
                        Item.id == item_id
                    )
                )
            ).one()
            order = (
                await conn.execute(
                    select(Order).where(Order.id == order_id, Order.item_id == item_id)
                )
            ).first()
            if order is None and not succeeded:
                return None
            price = Money(item.price_cents, item.currency)
            settlement = _archived_answer(order, payment_id, succeeded, charged, price)
            if settlement.refund_owed:
                assert isinstance(settlement.reason, RefundReason)
                shard = home_shard(order.buyer, item.stock_shards) if order is not None else 0
                await _owe_archived_refund(
                    conn, item_id, order_id, order, shard, payment_id, settlement.reason, charged
                )
            reason = settlement.reason.value if settlement.reason else None
            await keep_payments(
                conn,
                item_id,
                [
                    PaymentRecord(
                        payment_id=payment_id, item_id=item_id, order_id=order_id,
                        succeeded=succeeded, outcome=settlement.outcome.value, reason=reason,
                        charged=charged,
                    )
                ],
            )  # fmt: skip
        return settlement


def _owed(per_currency: Sequence[Any]) -> Owed:
    """Refunds owed from (currency, count, sum) rows."""
    return Owed(
        sum(int(count) for _, count, _ in per_currency),
        {currency: int(cents) for currency, _, cents in per_currency},
    )


def _replayed(
    first: PaymentRecord, order_id: int, succeeded: bool, charged: Money
) -> PaymentSettlement:
    if (
        first.order_id != order_id
        or first.succeeded != succeeded
        or (first.charged is not None and first.charged != charged)
    ):
        sum_ = f" ({first.charged})" if first.charged else ""
        raise InvalidRequest(
            ErrorCode.PAYMENT_ID_REUSED,
            f"payment {first.payment_id} was settled as "
            f"{'succeeded' if first.succeeded else 'failed'}{sum_} for order {first.order_id}",
        )
    outcome = Outcome(first.outcome)
    reasons = RefundReason if outcome is Outcome.REFUND_REQUIRED else ReleaseReason
    return PaymentSettlement(
        outcome, reasons(first.reason) if first.reason else None, replayed=True
    )


def _archived_answer(
    order: Any, payment_id: str, succeeded: bool, charged: Money, price: Money
) -> PaymentSettlement:
    """What a notice does to an archived item's order (every one is paid or released; None:
    no such order), as settle_payment.lua decides it."""
    refund = Outcome.REFUND_REQUIRED
    if order is None:
        return PaymentSettlement(refund, RefundReason.UNKNOWN_ORDER)
    if succeeded and charged.currency != price.currency:
        return PaymentSettlement(refund, RefundReason.CURRENCY_MISMATCH)
    if succeeded and charged != price.times(order.quantity):
        return PaymentSettlement(refund, RefundReason.AMOUNT_MISMATCH)
    status = OrderStatus(order.status)
    if status is OrderStatus.PAID:
        if not succeeded:
            return PaymentSettlement(Outcome.ALREADY_PAID)
        if order.payment_id == payment_id:  # its own payment, its record lost: still paid
            return PaymentSettlement(Outcome.PAID)
        return PaymentSettlement(refund, RefundReason.DUPLICATE_CHARGE)
    if status not in RELEASED_STATUSES:
        raise RuntimeError(f"archived item {order.item_id} has order {order.id} {status}")
    reason = ReleaseReason(order.release_reason or ReleaseReason.EXPIRED)
    if not succeeded:
        return PaymentSettlement(Outcome.ALREADY_RELEASED, reason)
    return PaymentSettlement(refund, RefundReason(reason.value))


async def _lock_item(conn: AsyncConnection, item_id: int) -> None:
    """One notice of an item settled at a time, so a payment id is taken once: the item's row
    locked (SQLite: the database's write lock, taken before the first read). Idempotent."""
    if conn.dialect.name == "sqlite":
        raw = (await conn.get_raw_connection()).driver_connection
        if raw is not None and not raw.in_transaction:
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        await conn.execute(select(Item.id).where(Item.id == item_id).with_for_update())


async def _owe_archived_refund(
    conn: AsyncConnection,
    item_id: int,
    order_id: int,
    order: Any,
    shard: int,
    payment_id: str,
    reason: RefundReason,
    charged: Money,
) -> None:
    """A refund owed of the sum charged for an archived item's order (None: an order nobody
    knows), with its journal row, as a landed `refund_required` event leaves them (it moves no
    stock). The first for a released order marks it refund_required. The journal row is named
    as stream entries are: the time, and a sequence unique within it (the item's notices are
    settled one at a time)."""
    now = datetime.now(UTC)
    prefix = f"{datetime_to_ms(now)}-"
    taken = await conn.execute(
        select(func.count())
        .select_from(StockFlow)
        .where(
            StockFlow.item_id == item_id,
            StockFlow.shard == shard,
            StockFlow.event_id.startswith(prefix),
        )
    )
    event_id = f"{prefix}{int(taken.scalar_one())}"
    if reason not in ORDER_KEPT and order.status == OrderStatus.RELEASED:
        await conn.execute(
            update(Order)
            .where(Order.id == order_id, Order.status == OrderStatus.RELEASED.value)
            .values(status=OrderStatus.REFUND_REQUIRED.value, updated_at=now)
        )
    buyer, quantity = (order.buyer, order.quantity) if order is not None else (None, None)
    await conn.execute(
        insert(StockFlow).values(
            item_id=item_id, shard=shard, event_id=event_id,
            event=EventKind.REFUND_REQUIRED.value, order_id=order_id, quantity=quantity,
            reason=reason.value, at=now, available_delta=0, held_delta=0, sold_delta=0,
        )
    )  # fmt: skip
    await conn.execute(
        insert(Refund).values(
            item_id=item_id, payment_id=payment_id, order_id=order_id, buyer=buyer,
            quantity=quantity, amount_cents=charged.cents, currency=charged.currency,
            reason=reason.value, shard=shard, event_id=event_id, owed_at=now, refunded_at=None,
        )
    )  # fmt: skip


async def keep_payments(
    conn: AsyncConnection, item_id: int, payments: Sequence[PaymentRecord]
) -> None:
    """Record an item's payment notices in ``conn``'s transaction; one already recorded keeps
    its first answer."""
    if not payments:
        return
    await _lock_item(conn, item_id)
    known = set(
        (
            await conn.execute(
                select(Payment.payment_id).where(
                    Payment.item_id == item_id,
                    Payment.payment_id.in_([p.payment_id for p in payments]),
                )
            )
        ).scalars()
    )
    now = datetime.now(UTC)
    fresh = {
        p.payment_id: {
            "payment_id": p.payment_id, "item_id": item_id, "order_id": p.order_id,
            "succeeded": p.succeeded, "outcome": p.outcome, "reason": p.reason,
            "amount_cents": p.charged.cents if p.charged else None,
            "currency": p.charged.currency if p.charged else None, "recorded_at": now,
        }
        for p in payments
        if p.payment_id not in known
    }  # fmt: skip
    if fresh:
        await conn.execute(insert(Payment), list(fresh.values()))


def refund_record(row: Any) -> RefundRecord:
    return RefundRecord(
        id=row.id, item_id=row.item_id, payment_id=row.payment_id, order_id=row.order_id,
        buyer=row.buyer, quantity=row.quantity, amount_cents=row.amount_cents,
        currency=row.currency, reason=row.reason,
        shard=row.shard, event_id=row.event_id, owed_at=row.owed_at,
        refunded_at=row.refunded_at,
    )  # fmt: skip


def payment_record(row: Any) -> PaymentRecord:
    return PaymentRecord(
        payment_id=row.payment_id, item_id=row.item_id, order_id=row.order_id,
        succeeded=row.succeeded, outcome=row.outcome, reason=row.reason,
        charged=Money(row.amount_cents, row.currency) if row.currency else None,
    )  # fmt: skip
