"""Landing a batch of stream events in SQL: once in effect, in one transaction.

Counters move only through order transitions (``domain.orders``), never straight from events:
an event moves an order forward and the transition says how stock moves. Events of one order may
land in any order (several persisters share a stream) and any number of times (redelivery): a
transition happens at most once, so the inventory always equals the sum over orders, and
statuses never move backwards. Across orders, one ordering matters: a unit released and sold
again must land the release first, or `available` would dip below zero (which its CHECK
forbids); landing then raises AheadOfStream and the persister waits for the release to land.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain.events import TRANSFERS, AheadOfStream, BadEvent, EventKind, StockEvent
from seckill.domain.orders import NO_MOVES, RELEASED_STATUSES, Moves, OrderStatus, transition
from seckill.domain.times import ms_to_datetime
from seckill.store.tables import Inventory, Item, Order, StockFlow, UTCDateTime


async def land_batch(engine: AsyncEngine, events: Sequence[StockEvent]) -> int:
    """Land a batch in one transaction; returns how many events were new.

    Raises BadEvent for an event that contradicts the record (a paid order released, a quantity
    that changed, an item SQL does not know), and lets database errors through: nothing is
    written unless everything is.
    """
    unique = list({(e.item_id, e.shard, e.event_id): e for e in events}.values())
    async with engine.begin() as conn:
        orders = await _lock_orders(conn, {e.order_id for e in unique if e.order_id})
        # An event commits with its order's row, so only events of orders already on record (and
        # `loaded` events, which have none) can have landed before: a fresh backlog skips the
        # journal look-up.
        maybe_seen = [e for e in unique if e.order_id is None or e.order_id in orders]
        seen = await _seen(conn, maybe_seen)
        fresh = [e for e in unique if (e.item_id, e.shard, e.event_id) not in seen]
        if not fresh:
            return 0
        prices = await _prices(conn, {e.item_id for e in fresh})
        plan = _Plan(orders, prices)
        for event in sorted(fresh, key=lambda e: (e.item_id, e.shard, e.position)):
            plan.add(event)
        await plan.write(conn)
        return len(fresh)


def padded_position(event: StockEvent) -> str:
    """A stream position as a string that sorts like the position itself."""
    ms, seq = event.position
    return f"{ms:020d}-{seq:020d}"


@dataclass(slots=True)
class _OrderState:
    status: OrderStatus
    quantity: int
    buyer: str
    item_id: int


async def _seen(conn: AsyncConnection, events: Sequence[StockEvent]) -> set[tuple[int, int, str]]:
    if not events:
        return set()
    rows = await conn.execute(
        select(StockFlow.item_id, StockFlow.shard, StockFlow.event_id).where(
            tuple_(StockFlow.item_id, StockFlow.shard, StockFlow.event_id).in_(
                [(e.item_id, e.shard, e.event_id) for e in events]
            )
        )
    )
    return {(r.item_id, r.shard, r.event_id) for r in rows}


async def _lock_orders(conn: AsyncConnection, ids: set[int]) -> dict[int, _OrderState]:
    if not ids:
        return {}
    rows = await conn.execute(
        select(Order.id, Order.status, Order.quantity, Order.buyer, Order.item_id)
        .where(Order.id.in_(sorted(ids)))
        .order_by(Order.id)  # one lock order for every persister: no deadlock between them
        .with_for_update()
    )
    return {r.id: _OrderState(OrderStatus(r.status), r.quantity, r.buyer, r.item_id) for r in rows}


async def _prices(conn: AsyncConnection, item_ids: set[int]) -> dict[int, int]:
    rows = await conn.execute(select(Item.id, Item.price_cents).where(Item.id.in_(item_ids)))
    prices = {r.id: r.price_cents for r in rows}
    unknown = item_ids - prices.keys()
    if unknown:
        raise BadEvent(f"events for items SQL does not know: {sorted(unknown)}")
    return prices


class _Plan:
    """What one batch writes, worked out in memory before a single statement runs."""

    def __init__(self, orders: dict[int, _OrderState], prices: dict[int, int]) -> None:
        self.orders = orders
        self.prices = prices
        self.journal: list[dict[str, Any]] = []
        self.inserts: dict[int, dict[str, Any]] = {}
        self.updates: list[dict[str, Any]] = []
        self.stock: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
        self.loads: dict[int, StockEvent] = {}
        self.now = datetime.now(UTC)

    def add(self, event: StockEvent) -> None:
        moves = NO_MOVES
        if event.kind is EventKind.LOADED:
            # Every shard journals its own load; the item's total is the head's (shard 0).
            newest = self.loads.get(event.item_id)
            if event.shard == 0 and (newest is None or newest.position < event.position):
                self.loads[event.item_id] = event
        elif event.kind not in TRANSFERS:  # units moving between shards stay the item's
            moves = self._move_order(event)
        assert event.quantity is not None or event.kind is EventKind.LOADED
        units = event.quantity or 0
        delta = [m * units for m in moves]
        for i, d in enumerate(delta):
            self.stock[event.item_id][i] += d
        self.journal.append(
            {
                "item_id": event.item_id,
                "shard": event.shard,
                "event_id": event.event_id,
                "event": event.kind.value,
                "order_id": event.order_id,
                "quantity": event.quantity,
                "reason": event.reason.value if event.reason else None,
                "transfer_id": event.transfer_id,
                "at": ms_to_datetime(event.at_ms),
                "available_delta": delta[0],
                "held_delta": delta[1],
                "sold_delta": delta[2],
            }
        )

    def _move_order(self, event: StockEvent) -> Moves:
        assert event.order_id is not None and event.quantity is not None and event.buyer
        current = self.orders.get(event.order_id)
        if current is not None and (
            (current.quantity, current.buyer, current.item_id)
            != (event.quantity, event.buyer, event.item_id)
        ):
            raise BadEvent(
                f"{event.kind} event for order {event.order_id} says {event.quantity} x "
                f"{event.buyer!r} of item {event.item_id}; the order says {current.quantity} x "
                f"{current.buyer!r} of item {current.item_id}"
            )
        status = current.status if current else None
        try:
            step = transition(status, event.kind)
        except BadEvent:
            raise BadEvent(
                f"order {event.order_id} is {status}: a {event.kind} event cannot apply"
            ) from None
        if step is None:
            return NO_MOVES
        new_status, moves = step
        at = ms_to_datetime(event.at_ms)
        if current is None:
            self.orders[event.order_id] = _OrderState(
                new_status, event.quantity, event.buyer, event.item_id
            )
            self.inserts[event.order_id] = {
                "id": event.order_id,
                "item_id": event.item_id,
                "buyer": event.buyer,
                "quantity": event.quantity,
                "price_cents": self.prices[event.item_id] * event.quantity,
                "status": new_status.value,
                "release_reason": event.reason.value if event.reason else None,
                "deadline_at": ms_to_datetime(event.deadline_ms) if event.deadline_ms else None,
                "request_id": event.request_id,
                "reserved_at": at,
                "paid_at": at if new_status is OrderStatus.PAID else None,
                "released_at": at if new_status in RELEASED_STATUSES else None,
                "updated_at": self.now,
            }
        elif event.order_id in self.inserts:  # born in this batch: amend the insert
            current.status = new_status
            row = self.inserts[event.order_id]
            row["status"] = new_status.value
            if new_status is OrderStatus.PAID:
                row["paid_at"] = at
            elif row["released_at"] is None:  # released now; a refund keeps its release's time
                row["released_at"] = at
            row["release_reason"] = row["release_reason"] or (
                event.reason.value if event.reason else None
            )
        else:
            self.updates.append(
                {
                    "b_id": event.order_id,
                    "b_from": current.status.value,
                    "b_status": new_status.value,
                    "b_paid_at": at if new_status is OrderStatus.PAID else None,
                    "b_released_at": at if new_status in RELEASED_STATUSES else None,
                    "b_reason": event.reason.value if event.reason else None,
                    "b_now": self.now,
                }
            )
            current.status = new_status
        return moves

    async def write(self, conn: AsyncConnection) -> None:
        await conn.execute(insert(StockFlow), self.journal)
        if self.inserts:
            # In id order, like the locks: persisters never wait on each other in a cycle.
            await conn.execute(insert(Order), [self.inserts[i] for i in sorted(self.inserts)])
        for row in self.updates:
            # One row at a time: each is guarded by the status it moves from.
            result = await conn.execute(_ADVANCE_ORDER, row)
            if result.rowcount != 1:
                raise BadEvent(f"order {row['b_id']} was not {row['b_from']} when it moved")
        for item_id, (available, held, sold) in self.stock.items():
            if available or held or sold:
                await _move_stock(conn, item_id, available, held, sold)
        for event in self.loads.values():
            await conn.execute(
                update(Inventory)
                .where(
                    Inventory.item_id == event.item_id,
                    Inventory.loaded_position < padded_position(event),
                )
                # MariaDB assigns left to right, each seeing the ones before: available must
                # read the old total, so it comes first.
                .ordered_values(
                    (Inventory.available, Inventory.available + (event.total - Inventory.total)),
                    (Inventory.total, event.total),
                    (Inventory.version, Inventory.version + 1),
                    (Inventory.loaded_position, padded_position(event)),
                )
            )


_ADVANCE_ORDER = (
    update(Order)
    .where(and_(Order.id == bindparam("b_id"), Order.status == bindparam("b_from")))
    .values(
        status=bindparam("b_status"),
        # Set once: a refund after the release keeps the release's time and reason.
        # (Typed parameters: inside COALESCE they would not get the column's bind processing.)
        paid_at=func.coalesce(Order.paid_at, bindparam("b_paid_at", type_=UTCDateTime())),
        released_at=func.coalesce(
            Order.released_at, bindparam("b_released_at", type_=UTCDateTime())
        ),
        release_reason=func.coalesce(
            Order.release_reason, bindparam("b_reason", type_=Order.release_reason.type)
        ),
        updated_at=bindparam("b_now"),
    )
)


async def _move_stock(
    conn: AsyncConnection, item_id: int, available: int, held: int, sold: int
) -> None:
    result = await conn.execute(
        update(Inventory)
        .where(
            Inventory.item_id == item_id,
            Inventory.available + available >= 0,
            Inventory.held + held >= 0,
            Inventory.sold + sold >= 0,
        )
        .values(
            available=Inventory.available + available,
            held=Inventory.held + held,
            sold=Inventory.sold + sold,
            version=Inventory.version + 1,
        )
    )
    if result.rowcount != 1:
        raise AheadOfStream(
            f"inventory of item {item_id} cannot move by available {available:+}, held "
            f"{held:+}, sold {sold:+}: a counter would go below zero"
        )
