"""The ledger: lands stream events in SQL, once in effect, in one transaction per batch.

Counters move only through order transitions, never straight from events: an event moves an
order forward (absent -> held -> paid | released -> refund_required), and the transition says
how stock moves. Events of one order may land in any order (several persisters share a stream)
and any number of times (redelivery): a transition happens at most once, so the inventory always
equals the sum over orders, and states never move backwards. Across orders, one ordering
matters: a unit released and sold again must land the release first, or `available` would dip
below zero (which its CHECK forbids); the ledger then raises AheadOfStream and the persister
waits for the release to land.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain import rules
from seckill.domain.events import AheadOfStream, BadEvent, EventKind, StockEvent
from seckill.domain.items import SaleItem, Stock
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.store.tables import (
    DeadLetter,
    Inventory,
    Item,
    Order,
    Repair,
    StockFlow,
    UTCDateTime,
    datetime_to_ms,
    ms_to_datetime,
)

Moves = tuple[int, int, int]  # available, held, sold (per unit)

# (status before, event) -> (status after, how each unit moves). Absent means no row yet.
TRANSITIONS: dict[tuple[str | None, EventKind], tuple[str, Moves]] = {
    (None, EventKind.RESERVED): ("held", (-1, +1, 0)),
    (None, EventKind.PAID): ("paid", (-1, 0, +1)),  # its `reserved` lands later, as a no-op
    (None, EventKind.RELEASED): ("released", (0, 0, 0)),
    ("held", EventKind.PAID): ("paid", (0, -1, +1)),
    ("held", EventKind.RELEASED): ("released", (+1, -1, 0)),
    # A payment that came after the release: the money goes back, the stock is never sold.
    # Of the release and the refund, whichever lands second moves nothing: a refund that finds
    # the order still held moves its units back itself.
    (None, EventKind.REFUND_REQUIRED): ("refund_required", (0, 0, 0)),
    ("held", EventKind.REFUND_REQUIRED): ("refund_required", (+1, -1, 0)),
    ("released", EventKind.REFUND_REQUIRED): ("refund_required", (0, 0, 0)),
}
# Already at or past where the event leads: nothing to do.
NO_OPS = {
    *((status, EventKind.RESERVED) for status in ("held", "paid", "released", "refund_required")),
    ("paid", EventKind.PAID),
    ("released", EventKind.RELEASED),
    ("refund_required", EventKind.RELEASED),
    ("refund_required", EventKind.REFUND_REQUIRED),
}
# Statuses in which the order's stock has gone back: it has a released_at (set once).
RELEASED_STATUSES = frozenset({"released", "refund_required"})


def status_after(status: str | None, kind: EventKind) -> str | None:
    """Where one event leads an order that is ``status`` (None: no row yet), by the rules above;
    BadEvent if it cannot apply. ``loaded`` events belong to no order and change nothing."""
    if kind is EventKind.LOADED or (status, kind) in NO_OPS:
        return status
    step = TRANSITIONS.get((status, kind))
    if step is None:
        raise BadEvent(f"an order that is {status} cannot take a {kind} event")
    return step[0]


def padded_position(event: StockEvent) -> str:
    """A stream position as a string that sorts like the position itself."""
    ms, seq = event.position
    return f"{ms:020d}-{seq:020d}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NewItem:
    name: str
    price_cents: int
    total: int
    starts_at: datetime
    ends_at: datetime
    per_buyer_limit: int
    hold_seconds: int

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 200:
            raise InvalidRequest(ErrorCode.INVALID_ITEM, "name must be 1 to 200 characters")
        if not isinstance(self.price_cents, int) or self.price_cents < 0:
            raise InvalidRequest(ErrorCode.INVALID_ITEM, "price must be whole cents >= 0")
        if self.starts_at.tzinfo is None or self.ends_at.tzinfo is None:
            raise InvalidRequest(ErrorCode.INVALID_ITEM, "sale window times need a time zone")
        rules.check_sale_item(
            total=self.total,
            starts_at_ms=datetime_to_ms(self.starts_at),
            ends_at_ms=datetime_to_ms(self.ends_at),
            per_buyer_limit=self.per_buyer_limit,
            hold_ms=self.hold_seconds * 1000 if isinstance(self.hold_seconds, int) else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRecord:
    """An item as SQL records it: what buyers see, and what warming loads."""

    item_id: int
    name: str
    price_cents: int
    total: int
    starts_at: datetime
    ends_at: datetime
    per_buyer_limit: int
    hold_seconds: int

    def sale_item(self) -> SaleItem:
        return SaleItem(
            item_id=self.item_id,
            total=self.total,
            starts_at_ms=datetime_to_ms(self.starts_at),
            ends_at_ms=datetime_to_ms(self.ends_at),
            per_buyer_limit=self.per_buyer_limit,
            hold_ms=self.hold_seconds * 1000,
        )


def _item_record(row: Any) -> ItemRecord:
    return ItemRecord(
        item_id=row.id,
        name=row.name,
        price_cents=row.price_cents,
        total=row.total,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        per_buyer_limit=row.per_buyer_limit,
        hold_seconds=row.hold_seconds,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LandedOrder:
    """One order row, as landed from the stream."""

    order_id: int
    item_id: int
    buyer: str
    quantity: int
    status: str
    release_reason: str | None
    deadline_at: datetime | None


@dataclass(frozen=True, slots=True)
class OrderRecord:
    order_id: int
    buyer: str
    quantity: int
    status: str
    release_reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterRecord:
    id: int
    stream: str
    entry_id: str
    payload: dict[str, str]
    error: str
    deliveries: int
    created_at: datetime
    replayed_at: datetime | None


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One landed event, as the reconciler needs it."""

    event_id: str
    event: EventKind
    order_id: int | None
    quantity: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemBook:
    """Everything SQL records about one item, read in one snapshot (one transaction)."""

    item: ItemRecord | None
    stock: Stock | None
    orders: dict[int, LandedOrder]
    journal: list[JournalRow]


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairRecord:
    item_id: int
    kind: str  # the drift it repairs
    subject: str  # an order id, a counter, the item
    action: str  # what was done, and which side won
    detail: str


@dataclass(slots=True)
class _OrderState:
    status: str
    quantity: int
    buyer: str
    item_id: int


class Ledger:
    """Writes landed events and reads the record. Safe to share between tasks and processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def apply(self, events: Sequence[StockEvent]) -> int:
        """Land a batch in one transaction; returns how many events were new.

        Raises BadEvent for an event that contradicts the record (a paid order released, a
        quantity that changed, an item SQL does not know), and lets database errors through:
        nothing is written unless everything is.
        """
        unique = list({(e.item_id, e.event_id): e for e in events}.values())
        async with self.engine.begin() as conn:
            orders = await self._lock_orders(conn, {e.order_id for e in unique if e.order_id})
            # An event commits with its order's row, so only events of orders already on record
            # (and `loaded` events, which have none) can have landed before: a fresh backlog
            # skips the journal look-up.
            maybe_seen = [e for e in unique if e.order_id is None or e.order_id in orders]
            seen = await self._seen(conn, maybe_seen)
            fresh = [e for e in unique if (e.item_id, e.event_id) not in seen]
            if not fresh:
                return 0
            prices = await self._prices(conn, {e.item_id for e in fresh})
            plan = _Plan(orders, prices)
            for event in sorted(fresh, key=lambda e: (e.item_id, e.position)):
                plan.add(event)
            await plan.write(conn)
            return len(fresh)

    # -- the record: items, counters, orders, dead letters --------------------------------------

    async def create_item(self, item: NewItem) -> int:
        """Put an item in the record with its inventory (all stock available); returns its id."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                insert(Item).values(
                    name=item.name,
                    price_cents=item.price_cents,
                    total=item.total,
                    starts_at=item.starts_at,
                    ends_at=item.ends_at,
                    per_buyer_limit=item.per_buyer_limit,
                    hold_seconds=item.hold_seconds,
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
        async with self.engine.connect() as conn:
            await _begin_snapshot(conn)
            item = (await conn.execute(select(Item).where(Item.id == item_id))).first()
            stock = await _stock(conn, item_id)
            orders = await conn.execute(select(Order).where(Order.item_id == item_id))
            journal = await conn.execute(
                select(
                    StockFlow.event_id, StockFlow.event, StockFlow.order_id, StockFlow.quantity
                ).where(StockFlow.item_id == item_id)
            )
            book = ItemBook(
                item=None if item is None else _item_record(item),
                stock=stock,
                orders={row.id: _landed_order(row) for row in orders},
                journal=[
                    JournalRow(r.event_id, EventKind(r.event), r.order_id, r.quantity)
                    for r in journal
                ],
            )
            await conn.rollback()
        return book

    # -- repairs (the reconciler's; each is journaled with record_repair) -----------------------

    async def recount_inventory(self, item_id: int) -> tuple[Stock, Stock] | None:
        """Set held and sold to the sums over the item's orders (the orders win: each row is an
        order's own record, the counters only their sum); returns (before, after).

        The inventory row is locked first, so a batch landing at the same time either committed
        before the count (and is in it) or moves the counters after it (by its own delta)."""
        held = _units_in(item_id, "held")
        sold = _units_in(item_id, "paid")
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
        self, order_id: int, *, status: str, quantity: int, buyer: str, expected: LandedOrder
    ) -> bool:
        """Put an edited order row back to what its journal (and Redis) say; False if the row
        changed since ``expected`` was read (nothing written: look again)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(Order)
                .where(
                    Order.id == order_id,
                    Order.status == expected.status,
                    Order.quantity == expected.quantity,
                    Order.buyer == expected.buyer,
                )
                .values(
                    status=status,
                    quantity=quantity,
                    buyer=buyer,
                    price_cents=select(Item.price_cents * quantity)
                    .where(Item.id == Order.item_id)
                    .scalar_subquery(),
                    updated_at=datetime.now(UTC),
                )
            )
            return result.rowcount == 1

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
                r.id: OrderRecord(r.id, r.buyer, r.quantity, r.status, r.release_reason)
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
                select(DeadLetter.id).where(
                    DeadLetter.stream == stream, DeadLetter.entry_id == entry_id
                )
            )
            if known.first() is None:
                await conn.execute(
                    insert(DeadLetter).values(
                        stream=stream,
                        entry_id=entry_id,
                        payload=json.dumps(payload, sort_keys=True),
                        error=error[:4000],
                        deliveries=deliveries,
                        created_at=datetime.now(UTC),
                    )
                )

    async def dead_letters(self, *, include_replayed: bool = False) -> list[DeadLetterRecord]:
        query = select(DeadLetter).order_by(DeadLetter.id)
        if not include_replayed:
            query = query.where(DeadLetter.replayed_at.is_(None))
        async with self.engine.connect() as conn:
            rows = await conn.execute(query)
            return [
                DeadLetterRecord(
                    id=r.id, stream=r.stream, entry_id=r.entry_id, payload=json.loads(r.payload),
                    error=r.error, deliveries=r.deliveries, created_at=r.created_at,
                    replayed_at=r.replayed_at,
                )
                for r in rows
            ]  # fmt: skip

    async def dead_letter_count(self, stream: str) -> int:
        """Dead letters of one stream not replayed yet."""
        async with self.engine.connect() as conn:
            count = await conn.execute(
                select(func.count())
                .select_from(DeadLetter)
                .where(DeadLetter.stream == stream, DeadLetter.replayed_at.is_(None))
            )
            return int(count.scalar_one())

    async def mark_replayed(self, dead_letter_id: int) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(DeadLetter)
                .where(DeadLetter.id == dead_letter_id)
                .values(replayed_at=datetime.now(UTC))
            )

    # -- landing ---------------------------------------------------------------------------------

    async def _seen(
        self, conn: AsyncConnection, events: Sequence[StockEvent]
    ) -> set[tuple[int, str]]:
        if not events:
            return set()
        rows = await conn.execute(
            select(StockFlow.item_id, StockFlow.event_id).where(
                tuple_(StockFlow.item_id, StockFlow.event_id).in_(
                    [(e.item_id, e.event_id) for e in events]
                )
            )
        )
        return {(r.item_id, r.event_id) for r in rows}

    async def _lock_orders(self, conn: AsyncConnection, ids: set[int]) -> dict[int, _OrderState]:
        if not ids:
            return {}
        rows = await conn.execute(
            select(Order.id, Order.status, Order.quantity, Order.buyer, Order.item_id)
            .where(Order.id.in_(sorted(ids)))
            .order_by(Order.id)  # one lock order for every persister: no deadlock between them
            .with_for_update()
        )
        return {r.id: _OrderState(r.status, r.quantity, r.buyer, r.item_id) for r in rows}

    async def _prices(self, conn: AsyncConnection, item_ids: set[int]) -> dict[int, int]:
        rows = await conn.execute(select(Item.id, Item.price_cents).where(Item.id.in_(item_ids)))
        prices = {r.id: r.price_cents for r in rows}
        unknown = item_ids - prices.keys()
        if unknown:
            raise BadEvent(f"events for items SQL does not know: {sorted(unknown)}")
        return prices


def _landed_order(row: Any) -> LandedOrder:
    return LandedOrder(
        order_id=row.id,
        item_id=row.item_id,
        buyer=row.buyer,
        quantity=row.quantity,
        status=row.status,
        release_reason=row.release_reason,
        deadline_at=row.deadline_at,
    )


_STOCK = (Inventory.total, Inventory.available, Inventory.held, Inventory.sold)


async def _stock(conn: AsyncConnection, item_id: int) -> Stock | None:
    row = (await conn.execute(select(*_STOCK).where(Inventory.item_id == item_id))).first()
    return None if row is None else Stock(*row)


def _units_in(item_id: int, status: str) -> Any:
    return (
        select(func.coalesce(func.sum(Order.quantity), 0))
        .where(Order.item_id == item_id, Order.status == status)
        .scalar_subquery()
    )


async def _begin_snapshot(conn: AsyncConnection) -> None:
    """Make every read that follows on ``conn`` see the same moment, on each backend."""
    if conn.dialect.name == "sqlite":
        await conn.exec_driver_sql("BEGIN")  # the driver itself begins nothing before a read
    else:
        await conn.execution_options(isolation_level="REPEATABLE READ")


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
        moves: Moves = (0, 0, 0)
        if event.kind is EventKind.LOADED:
            newest = self.loads.get(event.item_id)
            if newest is None or newest.position < event.position:
                self.loads[event.item_id] = event
        else:
            moves = self._move_order(event)
        assert event.quantity is not None or event.kind is EventKind.LOADED
        units = event.quantity or 0
        delta = [m * units for m in moves]
        for i, d in enumerate(delta):
            self.stock[event.item_id][i] += d
        self.journal.append(
            {
                "item_id": event.item_id,
                "event_id": event.event_id,
                "event": event.kind.value,
                "order_id": event.order_id,
                "quantity": event.quantity,
                "reason": event.reason.value if event.reason else None,
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
        if (status, event.kind) in NO_OPS:
            return (0, 0, 0)
        step = TRANSITIONS.get((status, event.kind))
        if step is None:
            raise BadEvent(f"order {event.order_id} is {status}: a {event.kind} event cannot apply")
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
                "status": new_status,
                "release_reason": event.reason.value if event.reason else None,
                "deadline_at": ms_to_datetime(event.deadline_ms) if event.deadline_ms else None,
                "request_id": event.request_id,
                "reserved_at": at,
                "paid_at": at if new_status == "paid" else None,
                "released_at": at if new_status in RELEASED_STATUSES else None,
                "updated_at": self.now,
            }
        elif event.order_id in self.inserts:  # born in this batch: amend the insert
            current.status = new_status
            row = self.inserts[event.order_id]
            row["status"] = new_status
            if new_status == "paid":
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
                    "b_from": current.status,
                    "b_status": new_status,
                    "b_paid_at": at if new_status == "paid" else None,
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
