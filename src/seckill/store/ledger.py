"""The ledger: SQL's record of the sale, and the queries on it.

Events land through ``apply`` (the batch itself is worked out in ``landing``); everything else
here reads the record, or repairs it for the reconciler.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain.events import EventKind, StockEvent
from seckill.domain.items import SALE_TERMS, ItemRecord, NewItem, SaleItem, Stock
from seckill.domain.orders import OrderStatus
from seckill.domain.times import datetime_to_ms
from seckill.store.dead_letters import DeadLetterQueries
from seckill.store.landing import EventKey, Turn, journaled, land_batch, plans_ahead
from seckill.store.payments import Payments, keep_payments, payment_record, refund_record
from seckill.store.records import (
    ItemBook,
    JournalRow,
    LandedOrder,
    OrderRecord,
    PaymentRecord,
    RefundRecord,
)
from seckill.store.repairs import STOCK_COLUMNS, RepairQueries, stock_of
from seckill.store.stream_groups import StreamGroupQueries
from seckill.store.tables import (
    Inventory,
    Item,
    Order,
    Payment,
    Refund,
    StockFlow,
)


def _item_record(row: Any) -> ItemRecord:
    return ItemRecord(item_id=row.id, **{name: getattr(row, name) for name in SALE_TERMS})


class Ledger(RepairQueries, DeadLetterQueries, StreamGroupQueries):
    """Writes landed events and reads the record (its repairs in ``store/repairs.py``, its dead
    letters in ``store/dead_letters.py``, the registry of stream groups in
    ``store/stream_groups.py``). Safe to share between tasks and processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.payments = Payments(engine)  # refunds owed, archived items' payment notices
        self.plans_ahead = plans_ahead(engine)  # see ``apply``'s ``turn``

    async def apply(self, events: Sequence[StockEvent], *, turn: Turn | None = None) -> int:
        """Land a batch in one transaction; returns how many events were new (see ``landing``;
        ``turn``, awaited between its rows and its counters, is for a batch landed ahead).

        Raises BadEvent for an event that contradicts the record (a paid order released, a
        quantity that changed, an item SQL does not know), and lets database errors through:
        nothing is written unless everything is.
        """
        return await land_batch(self.engine, events, turn=turn)

    async def landed_events(self, events: Sequence[StockEvent]) -> set[EventKey]:
        """Which of ``events`` the journal holds, by (item, shard, event id): landed, so SQL
        has them. One statement for the events of orders (found through their order's id)."""
        wanted = {(e.item_id, e.shard, e.event_id) for e in events}
        if not wanted:
            return set()
        return wanted & await journaled(self.engine, events)

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
                select(Inventory.item_id, *STOCK_COLUMNS).where(Inventory.item_id.in_(item_ids))
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

    async def items_before(
        self, before: int | None, limit: int, *, archived: bool | None = None
    ) -> list[tuple[ItemRecord, datetime | None]]:
        """Up to ``limit`` items, newest first (by id), below ``before`` if given; archived
        ones only, or none of them, when ``archived`` says so."""
        query = select(Item).order_by(Item.id.desc()).limit(limit)
        if before is not None:
            query = query.where(Item.id < before)
        if archived is not None:
            query = query.where(
                Item.archived_at.is_not(None) if archived else Item.archived_at.is_(None)
            )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
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

    async def end_sale(self, item_id: int, at: datetime) -> None:
        """End the item's sale at ``at``, unless it ends sooner already or is archived."""
        async with self.engine.begin() as conn:
            await conn.execute(
                update(Item)
                .where(Item.id == item_id, Item.ends_at > at, Item.archived_at.is_(None))
                .values(ends_at=at)
            )

    async def stock(self, item_id: int) -> Stock | None:
        async with self.engine.connect() as conn:
            return await stock_of(conn, item_id)

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


async def _begin_snapshot(conn: AsyncConnection) -> None:
    """Make every read that follows on ``conn`` see the same moment, on each backend."""
    if conn.dialect.name == "sqlite":
        await conn.exec_driver_sql("BEGIN")  # the driver itself begins nothing before a read
    else:
        await conn.execution_options(isolation_level="REPEATABLE READ")
