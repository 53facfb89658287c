"""The ledger: SQL's record of the sale, and the queries on it.

Events land through ``apply`` (the batch itself is worked out in ``landing``); everything else
here reads the record, or repairs it for the reconciler.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain.dead_letters import PERSISTER_GROUP, DeadLetter
from seckill.domain.events import EventKind, StockEvent
from seckill.domain.items import SALE_TERMS, STOCK_FIELDS, ItemRecord, NewItem, SaleItem, Stock
from seckill.domain.orders import OrderStatus
from seckill.domain.shards import home_shard
from seckill.domain.times import datetime_to_ms
from seckill.store.landing import land_batch
from seckill.store.payments import Payments, keep_payments, payment_record, refund_record
from seckill.store.records import (
    ItemBook,
    JournalRow,
    LandedOrder,
    OrderRecord,
    PaymentRecord,
    RefundRecord,
    RepairRecord,
)
from seckill.store.tables import DeadLetter as DeadLetterRow
from seckill.store.tables import (
    Inventory,
    Item,
    Order,
    Payment,
    Refund,
    Repair,
    StockFlow,
)


def _item_record(row: Any) -> ItemRecord:
    return ItemRecord(item_id=row.id, **{name: getattr(row, name) for name in SALE_TERMS})


class Ledger:
    """Writes landed events and reads the record. Safe to share between tasks and processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.payments = Payments(engine)  # refunds owed, archived items' payment notices

    async def apply(self, events: Sequence[StockEvent]) -> int:
        """Land a batch in one transaction; returns how many events were new (see ``landing``).

        Raises BadEvent for an event that contradicts the record (a paid order released, a
        quantity that changed, an item SQL does not know), and lets database errors through:
        nothing is written unless everything is.
        """
        return await land_batch(self.engine, events)

    # -- the record: items, counters, orders, dead letters --------------------------------------

    async def create_item(self, item: NewItem) -> int:
        """Put an item in the record with its inventory (all stock available); returns its id."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                insert(Item).values(
                    **{name: getattr(item, name) for name in SALE_TERMS},
                    created_at=datetime.now(UTC),
                )
            )
            key = result.inserted_primary_key
            assert key is not None
            item_id = int(key[0])
            await conn.execute(
                insert(Inventory).values(
                    item_id=item_id, total=item.total, available=item.total, held=0, sold=0,
                    version=0, loaded_position="",
                )
            )  # fmt: skip
        return item_id

    async def item(self, item_id: int) -> ItemRecord | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(Item).where(Item.id == item_id))).first()
        return None if row is None else _item_record(row)

    async def items_on_sale(self, now: datetime) -> list[ItemRecord]:
        """Items whose sale has not ended at ``now`` (on now, or still to come), by start."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(Item).where(Item.ends_at > now).order_by(Item.starts_at, Item.id)
                )
            ).all()
        return [_item_record(row) for row in rows]

    async def unfinished_item_ids(self) -> list[int]:
        """Items whose sale has not ended yet (their end time is still to come)."""
        now = datetime.now(UTC)
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(Item.id).where(Item.ends_at > now).order_by(Item.id))
            return [row.id for row in rows]

    async def sale_item(self, item_id: int) -> SaleItem | None:
        """The item as the engine sells it, or None if SQL has no such item."""
        record = await self.item(item_id)
        return None if record is None else record.sale_item()

    async def order(self, order_id: int) -> LandedOrder | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(Order).where(Order.id == order_id))).first()
        return None if row is None else _landed_order(row)

    async def book(self, item_id: int) -> ItemBook:
        """The item, its inventory, orders and journal, all as of one moment."""
        return (await self.books([item_id]))[item_id]

    async def books(self, item_ids: Sequence[int]) -> dict[int, ItemBook]:
        """``book`` of many items, all as of one moment: a statement per table for them all."""
        async with self.engine.connect() as conn:
            await _begin_snapshot(conn)
            items = await conn.execute(select(Item).where(Item.id.in_(item_ids)))
            stocks = await conn.execute(
                select(Inventory.item_id, *_STOCK).where(Inventory.item_id.in_(item_ids))
            )
            orders = await conn.execute(select(Order).where(Order.item_id.in_(item_ids)))
            journal = await conn.execute(
                select(
                    StockFlow.item_id,
                    StockFlow.event_id,
                    StockFlow.event,
                    StockFlow.order_id,
                    StockFlow.quantity,
                    StockFlow.shard,
                    StockFlow.reason,
                    StockFlow.at,
                ).where(StockFlow.item_id.in_(item_ids))
            )
            refunds = await conn.execute(select(Refund).where(Refund.item_id.in_(item_ids)))
            payments = await conn.execute(select(Payment).where(Payment.item_id.in_(item_ids)))
            records = {row.id: row for row in items}
            stock_of = {row.item_id: Stock(*row[1:]) for row in stocks}
            orders_of: dict[int, dict[int, LandedOrder]] = {i: {} for i in item_ids}
            for row in orders:
                orders_of[row.item_id][row.id] = _landed_order(row)
            journal_of: dict[int, list[JournalRow]] = {i: [] for i in item_ids}
            for r in journal:
                landed = JournalRow(
                    r.event_id, EventKind(r.event), r.order_id, r.quantity, r.shard, r.reason,
                    datetime_to_ms(r.at),
                )  # fmt: skip
                journal_of[r.item_id].append(landed)
            refunds_of: dict[int, dict[str, RefundRecord]] = {i: {} for i in item_ids}
            for refund in refunds:
                refunds_of[refund.item_id][refund.payment_id] = refund_record(refund)
            payments_of: dict[int, dict[str, PaymentRecord]] = {i: {} for i in item_ids}
            for payment in payments:
                payments_of[payment.item_id][payment.payment_id] = payment_record(payment)
            await conn.rollback()
        return {
            item_id: ItemBook(
                item=_item_record(records[item_id]) if item_id in records else None,
                stock=stock_of.get(item_id),
                orders=orders_of[item_id],
                journal=journal_of[item_id],
                archived=item_id in records and records[item_id].archived_at is not None,
                refunds=refunds_of[item_id],
                payments=payments_of[item_id],
            )
            for item_id in item_ids
        }

    # -- archiving: an item whose Redis keys are gone, answered from here ------------------------

    async def items(self) -> list[tuple[ItemRecord, datetime | None]]:
        """Every item, by id, with the time it was archived (None: it is not)."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(Item).order_by(Item.id))).all()
        return [(_item_record(row), row.archived_at) for row in rows]

    async def archived_at(self, item_id: int) -> datetime | None:
        async with self.engine.connect() as conn:
            found = await conn.execute(select(Item.archived_at).where(Item.id == item_id))
            return found.scalar_one_or_none()

    async def archive_candidates(
        self, item_ids: Sequence[int], *, ended_before: datetime
    ) -> list[int]:
        """Of ``item_ids``, those archived already (their removal from Redis to finish) and
        those whose sale ended before ``ended_before``, by id."""
        if not item_ids:
            return []
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(Item.id)
                .where(
                    Item.id.in_(item_ids),
                    (Item.ends_at <= ended_before) | Item.archived_at.is_not(None),
                )
                .order_by(Item.id)
            )
            return [row.id for row in rows]

    async def mark_archived(self, item_id: int, payments: Sequence[PaymentRecord]) -> None:
        """The commit point of archiving, one transaction: the item's payment notices are kept
        here, and the item is marked archived (from then on every read of it answers from SQL).
        Marking an archived item again keeps its first time."""
        async with self.engine.begin() as conn:
            await keep_payments(conn, item_id, payments)
            await conn.execute(
                update(Item)
                .where(Item.id == item_id, Item.archived_at.is_(None))
                .values(archived_at=datetime.now(UTC))
            )

    # -- repairs (the reconciler's; each is journaled with record_repair) -----------------------

    async def recount_inventory(self, item_id: int) -> tuple[Stock, Stock] | None:
        """Set held and sold to the sums over the item's orders (the orders win: each row is an
        order's own record, the counters only their sum); returns (before, after).

        The inventory row is locked first, so a batch landing at the same time either committed
        before the count (and is in it) or moves the counters after it (by its own delta)."""
        held = _units_in(item_id, OrderStatus.HELD)
        sold = _units_in(item_id, OrderStatus.PAID)
        async with self.engine.begin() as conn:
            before = (
                await conn.execute(
                    select(*_STOCK).where(Inventory.item_id == item_id).with_for_update()
                )
            ).first()
            if before is None:
                return None
            await conn.execute(
                update(Inventory)
                .where(Inventory.item_id == item_id)
                # Every value from the subqueries, none from another assignment: MariaDB assigns
                # left to right, PostgreSQL all at once.
                .values(
                    available=Inventory.total - held - sold,
                    held=held,
                    sold=sold,
                    version=Inventory.version + 1,
                )
            )
            after = await _stock(conn, item_id)
        assert after is not None  # the row is locked: it cannot have gone
        return Stock(*before), after

    async def rewrite_order(
        self,
        order_id: int,
        *,
        status: OrderStatus,
        quantity: int,
        buyer: str,
        expected: LandedOrder,
    ) -> bool:
        """Put an edited order row back to what its journal (and Redis) say; False if the row
        changed since ``expected`` was read (nothing written: look again)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(Order)
                .where(
                    Order.id == order_id,
                    Order.status == expected.status.value,
                    Order.quantity == expected.quantity,
                    Order.buyer == expected.buyer,
                )
                .values(
                    status=status.value,
                    quantity=quantity,
                    buyer=buyer,
                    price_cents=select(Item.price_cents * quantity)
                    .where(Item.id == Order.item_id)
                    .scalar_subquery(),
                    updated_at=datetime.now(UTC),
                )
            )
            return result.rowcount == 1

    async def journal_reservations(self, item_id: int, order_ids: Sequence[int]) -> list[int]:
        """Write the `reserved` journal row of each order whose journal lacks one, from the
        order's row (its buyer, units and time; the event moves no stock on a row already past
        it); returns the orders journaled. The row is named ``0-<order id>``: unique, and first
        in stream order, as a `reserved` is in its order's life (and never taken for an entry
        newer than what Redis has)."""
        async with self.engine.begin() as conn:
            have = select(StockFlow.order_id).where(
                StockFlow.item_id == item_id, StockFlow.event == EventKind.RESERVED.value
            )
            rows = (
                await conn.execute(
                    select(Order, Item.stock_shards)
                    .join(Item, Item.id == Order.item_id)
                    .where(
                        Order.item_id == item_id,
                        Order.id.in_(order_ids),
                        Order.id.not_in(have),
                    )
                    .order_by(Order.id)
                )
            ).all()
            if rows:
                await conn.execute(
                    insert(StockFlow),
                    [
                        {
                            "item_id": item_id, "shard": home_shard(r.buyer, r.stock_shards),
                            "event_id": f"0-{r.id}",
                            "event": EventKind.RESERVED.value, "order_id": r.id,
                            "quantity": r.quantity, "reason": None, "transfer_id": None,
                            "at": r.reserved_at, "available_delta": 0, "held_delta": 0,
                            "sold_delta": 0,
                        }
                        for r in rows
                    ],
                )  # fmt: skip
        return [r.id for r in rows]

    async def record_repair(self, repair: RepairRecord) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(Repair).values(
                    item_id=repair.item_id,
                    kind=repair.kind,
                    subject=repair.subject,
                    action=repair.action,
                    detail=repair.detail[:4000],
                    at=datetime.now(UTC),
                )
            )

    async def repairs(self, item_id: int) -> list[RepairRecord]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(Repair).where(Repair.item_id == item_id).order_by(Repair.id)
            )
            return [
                RepairRecord(
                    item_id=r.item_id, kind=r.kind, subject=r.subject, action=r.action,
                    detail=r.detail,
                )
                for r in rows
            ]  # fmt: skip

    async def stock(self, item_id: int) -> Stock | None:
        async with self.engine.connect() as conn:
            return await _stock(conn, item_id)

    async def orders(self, item_id: int) -> dict[int, OrderRecord]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(
                    Order.id, Order.buyer, Order.quantity, Order.status, Order.release_reason
                ).where(Order.item_id == item_id)
            )
            return {
                r.id: OrderRecord(
                    r.id, r.buyer, r.quantity, OrderStatus(r.status), r.release_reason
                )
                for r in rows
            }

    async def journal_kinds(self, item_id: int) -> Counter[str]:
        """How many events of each kind the item's journal holds."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(StockFlow.event, func.count())
                .where(StockFlow.item_id == item_id)
                .group_by(StockFlow.event)
            )
            return Counter({event: int(count) for event, count in rows})

    async def journal_size(self, item_id: int) -> int:
        async with self.engine.connect() as conn:
            count = await conn.execute(
                select(func.count()).select_from(StockFlow).where(StockFlow.item_id == item_id)
            )
            return int(count.scalar_one())

    async def add_dead_letter(
        self, *, stream: str, entry_id: str, payload: dict[str, str], error: str, deliveries: int
    ) -> None:
        """Record an entry given up on. Recording the same entry twice keeps the first."""
        async with self.engine.begin() as conn:
            known = await conn.execute(
                select(DeadLetterRow.id).where(
                    DeadLetterRow.stream == stream, DeadLetterRow.entry_id == entry_id
                )
            )
            if known.first() is None:
                await conn.execute(
                    insert(DeadLetterRow).values(
                        stream=stream,
                        entry_id=entry_id,
                        payload=json.dumps(payload, sort_keys=True),
                        error=error[:4000],
                        deliveries=deliveries,
                        created_at=datetime.now(UTC),
                    )
                )

    async def dead_letters(self, *, include_settled: bool = False) -> list[DeadLetter]:
        """The persister's dead letters, oldest first: pending ones only unless
        ``include_settled`` (replayed or dropped too)."""
        query = select(DeadLetterRow).order_by(DeadLetterRow.id)
        if not include_settled:
            query = query.where(_pending_letter())
        async with self.engine.connect() as conn:
            rows = await conn.execute(query)
            return [
                DeadLetter(
                    id=str(r.id), group=PERSISTER_GROUP, stream=r.stream, entry_id=r.entry_id,
                    payload=json.loads(r.payload), error=r.error, deliveries=r.deliveries,
                    died_at=r.created_at, replayed_at=r.replayed_at, dropped_at=r.dropped_at,
                )
                for r in rows
            ]  # fmt: skip

    async def dead_letter_count(self, stream: str) -> int:
        """Pending dead letters of one stream."""
        return (await self.dead_letter_counts([stream]))[stream]

    async def dead_letter_counts(self, streams: Sequence[str]) -> dict[str, int]:
        """``dead_letter_count`` of many streams (0 for one with none), in one statement."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(DeadLetterRow.stream, func.count())
                .where(DeadLetterRow.stream.in_(streams), _pending_letter())
                .group_by(DeadLetterRow.stream)
            )
            counted = {stream: int(count) for stream, count in rows}
        return {stream: counted.get(stream, 0) for stream in streams}

    async def mark_replayed(self, dead_letter_id: int) -> None:
        await self._settle_letter(dead_letter_id, replayed_at=datetime.now(UTC))

    async def mark_dropped(self, dead_letter_id: int) -> None:
        await self._settle_letter(dead_letter_id, dropped_at=datetime.now(UTC))

    async def _settle_letter(self, dead_letter_id: int, **settled: datetime) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(DeadLetterRow)
                .where(DeadLetterRow.id == dead_letter_id, _pending_letter())
                .values(**settled)
            )


def _pending_letter() -> Any:
    return DeadLetterRow.replayed_at.is_(None) & DeadLetterRow.dropped_at.is_(None)


def _landed_order(row: Any) -> LandedOrder:
    return LandedOrder(
        order_id=row.id,
        item_id=row.item_id,
        buyer=row.buyer,
        quantity=row.quantity,
        status=OrderStatus(row.status),
        release_reason=row.release_reason,
        deadline_at=row.deadline_at,
        payment_id=row.payment_id,
        idempotency_key=row.idempotency_key,
        reserved_at=row.reserved_at,
        request_id=row.request_id,
    )


_STOCK = tuple(getattr(Inventory, name) for name in STOCK_FIELDS)


async def _stock(conn: AsyncConnection, item_id: int) -> Stock | None:
    row = (await conn.execute(select(*_STOCK).where(Inventory.item_id == item_id))).first()
    return None if row is None else Stock(*row)


def _units_in(item_id: int, status: OrderStatus) -> Any:
    return (
        select(func.coalesce(func.sum(Order.quantity), 0))
        .where(Order.item_id == item_id, Order.status == status.value)
        .scalar_subquery()
    )


async def _begin_snapshot(conn: AsyncConnection) -> None:
    """Make every read that follows on ``conn`` see the same moment, on each backend."""
    if conn.dialect.name == "sqlite":
        await conn.exec_driver_sql("BEGIN")  # the driver itself begins nothing before a read
    else:
        await conn.execution_options(isolation_level="REPEATABLE READ")
