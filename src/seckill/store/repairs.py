"""The reconciler's repairs of SQL's record (each journaled with ``record_repair``), part of
the ledger (``store/ledger.py``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain.events import EventKind
from seckill.domain.items import STOCK_FIELDS, Stock
from seckill.domain.orders import OrderStatus
from seckill.domain.shards import home_shard
from seckill.store.records import ItemRebuilt, LandedOrder, RepairRecord
from seckill.store.tables import Inventory, Item, Order, Repair, StockFlow


class RepairQueries:
    """Recounting an item's inventory, rewriting an order, journaling missed reservations, and
    the repairs' own journal (and when an item was last rebuilt, from it)."""

    engine: AsyncEngine

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
                    select(*STOCK_COLUMNS).where(Inventory.item_id == item_id).with_for_update()
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
            after = await stock_of(conn, item_id)
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

    async def rebuilt(
        self, item_id: int, *, subject: str, kinds: Collection[str]
    ) -> ItemRebuilt | None:
        """The item's creation, its archiving and its last rebuild from SQL (the newest repair
        journaled on ``subject`` under one of ``kinds``), in one statement; None for an item SQL
        does not have."""
        last = (
            select(func.max(Repair.at))
            .where(Repair.item_id == item_id, Repair.subject == subject, Repair.kind.in_(kinds))
            .scalar_subquery()
        )
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(Item.created_at, Item.archived_at, last.label("rebuilt_at")).where(
                        Item.id == item_id
                    )
                )
            ).first()
        if row is None:
            return None
        return ItemRebuilt(
            created_at=row.created_at, archived_at=row.archived_at, rebuilt_at=row.rebuilt_at
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


# An item's counters as the inventory row holds them (the ledger's reads use them too).
STOCK_COLUMNS = tuple(getattr(Inventory, name) for name in STOCK_FIELDS)


async def stock_of(conn: AsyncConnection, item_id: int) -> Stock | None:
    row = (await conn.execute(select(*STOCK_COLUMNS).where(Inventory.item_id == item_id))).first()
    return None if row is None else Stock(*row)


def _units_in(item_id: int, status: OrderStatus) -> Any:
    return (
        select(func.coalesce(func.sum(Order.quantity), 0))
        .where(Order.item_id == item_id, Order.status == status.value)
        .scalar_subquery()
    )
