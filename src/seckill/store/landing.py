"""Landing a batch of stream events in SQL: once in effect, in one transaction.

Counters move only through order transitions (``domain.orders``), never straight from events:
an event moves an order forward and the transition says how stock moves. Events of one order may
land in any order (several persisters share a stream) and any number of times (redelivery): a
transition happens at most once, so the inventory always equals the sum over orders, and
statuses never move backwards. Across orders, one ordering matters: a unit released and sold
again must land the release first, or `available` would dip below zero (which its CHECK
forbids); landing then raises AheadOfStream and the persister waits for the release to land.

A batch costs a handful of statements whatever its size: one to lock its orders, the journal
rows and the new orders in bulk by the fastest way each driver offers (``store/bulk.py``, the only
code that knows a driver), and one counter update per item. A `refund_required` event also
records its refund owed, once per payment (a few statements, when the batch has any).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import Integer, Select, Table, bindparam, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from seckill.domain.events import (
    TRANSFERS,
    AheadOfStream,
    BadEvent,
    EventKind,
    RefundReason,
    StockEvent,
)
from seckill.domain.money import Money
from seckill.domain.orders import RELEASED_STATUSES, Moves, OrderStatus, moves_order, transition
from seckill.domain.times import ms_to_datetime
from seckill.store.bulk import ORDERS, Bulk, bulk_for
from seckill.store.tables import Inventory, Item, Order, Refund, StockFlow

EventKey = tuple[int, int, str]
"""An event as the journal names it: its item, its stock shard, its entry id there."""

Turn = Callable[[], Awaitable[None]]
"""Awaited by a batch landed ahead between its rows and its counters: until the batch before it
is in SQL (see ``land_batch``)."""


async def land_batch(
    engine: AsyncEngine,
    events: Sequence[StockEvent],
    *,
    turn: Turn | None = None,
) -> int:
    """Land a batch in one transaction; returns how many events were new.

    ``turn``, when given, is awaited once the batch has written its rows and before it moves
    any item's counters: a batch landed while the one before it lands writes its journal and
    orders meanwhile, then waits there until that one is done, so each item's counters still
    move in stream order (see ``plans_ahead``).

    Raises BadEvent for an event that contradicts the record (a paid order released, a quantity
    that changed, an item SQL does not know), and lets database errors through: nothing is
    written unless everything is.
    """
    unique = list({(e.item_id, e.shard, e.event_id): e for e in events}.values())
    async with engine.begin() as conn:
        bulk = bulk_for(conn.dialect)
        orders = await _lock_orders(conn, bulk, {e.order_id for e in unique if e.order_id})
        # An event commits with its order's row, so only events of orders already on record (and
        # `loaded` events, which have none) can have landed before: a fresh backlog skips the
        # journal look-up.
        maybe_seen = [e for e in unique if e.order_id is None or e.order_id in orders]
        seen = await _seen(conn, bulk, maybe_seen)
        fresh = [e for e in unique if (e.item_id, e.shard, e.event_id) not in seen]
        if not fresh:
            return 0
        prices = await _prices(conn, {e.item_id for e in fresh})
        plan = _Plan(orders, prices, db_time=bulk.db_time)
        for event in sorted(fresh, key=lambda e: (e.item_id, e.shard, e.position)):
            plan.add(event)
        await plan.write(conn, bulk, turn=turn)
        return len(fresh)


def plans_ahead(engine: AsyncEngine) -> bool:
    """Whether a batch may be planned and written in its own transaction while the batch before
    it lands. Not on a database with one writer (SQLite): the planning transaction's snapshot
    would be stale by the time it writes."""
    return not bulk_for(engine.dialect).single_writer


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


@dataclass(slots=True, kw_only=True)
class _NewOrder(_OrderState):
    """An order with no row yet: inserted as the batch's last event of it leaves it. Times are
    as the driver takes them (``Bulk.db_time``)."""

    price_cents: int
    release_reason: str | None
    deadline_at: Any
    request_id: str | None
    idempotency_key: str | None
    reserved_at: Any
    paid_at: Any = None
    released_at: Any = None
    payment_id: str | None = None


@dataclass(slots=True)
class _Advance:
    """An order on record that the batch moves forward: from the status it was locked in to the
    last one the batch's events lead to, in one step. Each time and the reason are set once
    (a refund after the release keeps the release's), so the first of the batch counts."""

    order_id: int
    from_status: OrderStatus
    status: OrderStatus
    paid_at: Any = None
    released_at: Any = None
    release_reason: str | None = None
    payment_id: str | None = None

    def row(self) -> tuple[Any, ...]:
        return (
            self.order_id, self.from_status.value, self.status.value, self.paid_at,
            self.released_at, self.release_reason, self.payment_id,
        )  # fmt: skip


_JOURNAL_COLUMNS = (
    "item_id", "shard", "event_id", "event", "order_id", "quantity", "reason", "transfer_id",
    "at", "available_delta", "held_delta", "sold_delta",
)  # fmt: skip
_ORDER_COLUMNS = (
    "id", "item_id", "buyer", "quantity", "price_cents", "status", "release_reason",
    "deadline_at", "request_id", "idempotency_key", "reserved_at", "paid_at", "released_at",
    "payment_id", "updated_at",
)  # fmt: skip


# The statements every batch runs are built once (per way of binding ids, for those that name
# orders): building them again took a tenth of a 500-entry batch's CPU.
_JOURNAL_KEY = (StockFlow.item_id, StockFlow.shard, StockFlow.event_id)


@cache
def _journal_of_orders(bulk: Bulk) -> Select[int, int, str]:
    return select(*_JOURNAL_KEY).where(bulk.one_of(StockFlow.order_id.expression))


@cache
def _lock_orders_statement(bulk: Bulk) -> Select[int, str, int, str, int]:
    return (
        select(Order.id, Order.status, Order.quantity, Order.buyer, Order.item_id)
        .where(bulk.one_of(Order.id.expression))
        .order_by(Order.id)  # one lock order for every persister: no deadlock between them
        .with_for_update()
    )


_PRICES = select(Item.id, Item.price_cents, Item.currency).where(
    Item.id.in_(bindparam("items", expanding=True))
)


async def journaled(engine: AsyncEngine, events: Sequence[StockEvent]) -> set[EventKey]:
    """The journal's keys among ``events`` (with, for those of an order, the order's others):
    what has landed, as ``land_batch`` itself looks it up."""
    async with engine.connect() as conn:
        return await _seen(conn, bulk_for(conn.dialect), events)


async def _seen(conn: AsyncConnection, bulk: Bulk, events: Sequence[StockEvent]) -> set[EventKey]:
    """Which of ``events`` the journal holds already. Those of an order are found through their
    order's id (indexed); the few of none (`loaded`, transfers) by their own key. (A thousand
    keys of three columns each in one IN took PostgreSQL over a second.)"""
    order_ids = sorted({e.order_id for e in events if e.order_id})
    orderless = [(e.item_id, e.shard, e.event_id) for e in events if e.order_id is None]
    seen: set[EventKey] = set()
    if order_ids:
        rows = await conn.execute(_journal_of_orders(bulk), {"ids": order_ids})
        seen.update((r.item_id, r.shard, r.event_id) for r in rows)
    if orderless:
        rows = await conn.execute(select(*_JOURNAL_KEY).where(tuple_(*_JOURNAL_KEY).in_(orderless)))
        seen.update((r.item_id, r.shard, r.event_id) for r in rows)
    return seen


async def _lock_orders(conn: AsyncConnection, bulk: Bulk, ids: set[int]) -> dict[int, _OrderState]:
    if not ids:
        return {}
    rows = await conn.execute(_lock_orders_statement(bulk), {"ids": sorted(ids)})
    return {r.id: _OrderState(OrderStatus(r.status), r.quantity, r.buyer, r.item_id) for r in rows}


async def _prices(conn: AsyncConnection, item_ids: set[int]) -> dict[int, Money]:
    """Each item's unit price."""
    rows = await conn.execute(_PRICES, {"items": sorted(item_ids)})
    prices = {r.id: Money(r.price_cents, r.currency) for r in rows}
    unknown = item_ids - prices.keys()
    if unknown:
        raise BadEvent(f"events for items SQL does not know: {sorted(unknown)}")
    return prices


class _Plan:
    """What one batch writes, worked out in memory before a single statement runs."""

    def __init__(
        self, orders: dict[int, _OrderState], prices: dict[int, Money], *, db_time: Any
    ) -> None:
        self.orders = orders
        self.prices = prices
        self.db_time = db_time
        self.journal: list[tuple[Any, ...]] = []
        self.born: dict[int, _NewOrder] = {}
        self.advances: dict[int, _Advance] = {}
        self.stock: dict[int, list[int]] = {}  # item -> available, held, sold
        self.loads: dict[int, StockEvent] = {}
        self.refunds: dict[tuple[int, str], dict[str, Any]] = {}  # (item, payment id) -> row
        self.now = datetime.now(UTC)
        self._moments: dict[int, Any] = {}

    def moment(self, ms: int) -> Any:
        """Epoch ``ms`` as the driver takes it. Remembered: the events of a batch crowd into a
        few milliseconds, and making a datetime costs more than the rest of an event's row."""
        moment = self._moments.get(ms)
        if moment is None:
            moment = self._moments[ms] = self.db_time(ms_to_datetime(ms))
        return moment

    def add(self, event: StockEvent) -> None:
        available = held = sold = 0
        if event.kind is EventKind.LOADED:
            # Every shard journals its own load; the item's total is the head's (shard 0).
            newest = self.loads.get(event.item_id)
            if event.shard == 0 and (newest is None or newest.position < event.position):
                self.loads[event.item_id] = event
        elif event.kind not in TRANSFERS:  # units moving between shards stay the item's
            if event.kind is EventKind.REFUND_REQUIRED:
                self._owe_refund(event)
            moves = self._move_order(event)
            if moves is not None:
                units = event.quantity or 0
                available, held, sold = (
                    moves.available * units,
                    moves.held * units,
                    moves.sold * units,
                )
                stock = self.stock.setdefault(event.item_id, [0, 0, 0])
                stock[0] += available
                stock[1] += held
                stock[2] += sold
        reason = event.reason
        self.journal.append(
            (
                event.item_id, event.shard, event.event_id, event.kind.value, event.order_id,
                event.quantity, reason.value if reason else None, event.transfer_id,
                self.moment(event.at_ms), available, held, sold,
            )
        )  # fmt: skip

    def _owe_refund(self, event: StockEvent) -> None:
        """The refund owed for the event's payment, of the sum charged (the first of the batch
        for it counts). An event journaled before notices carried their charge owes the
        order's sum."""
        assert event.order_id is not None
        if event.payment_id is None or event.reason is None:  # journaled before refunds were
            return
        if event.amount_cents is not None and event.currency is not None:
            charged = Money(event.amount_cents, event.currency)
        else:
            charged = self.prices[event.item_id].times(event.quantity or 0)
        self.refunds.setdefault(
            (event.item_id, event.payment_id),
            {
                "item_id": event.item_id, "payment_id": event.payment_id,
                "order_id": event.order_id, "buyer": event.buyer, "quantity": event.quantity,
                "amount_cents": charged.cents, "currency": charged.currency,
                "reason": event.reason.value, "shard": event.shard, "event_id": event.event_id,
                "owed_at": ms_to_datetime(event.at_ms), "refunded_at": None,
            },
        )  # fmt: skip

    def _move_order(self, event: StockEvent) -> Moves | None:
        """Move the event's order forward; returns how each unit moves (None: it does not)."""
        if event.reason is RefundReason.UNKNOWN_ORDER:  # its order id is the notice's, no more
            return None
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
        if not moves_order(event.kind, event.reason):
            return None
        status = current.status if current else None
        try:
            step = transition(status, event.kind)
        except BadEvent:
            raise BadEvent(
                f"order {event.order_id} is {status}: a {event.kind} event cannot apply"
            ) from None
        if step is None:
            return None
        new_status, moves = step
        reason = event.reason.value if event.reason else None
        if current is None:
            at = self.moment(event.at_ms)
            self.orders[event.order_id] = self.born[event.order_id] = _NewOrder(
                new_status, event.quantity, event.buyer, event.item_id,
                price_cents=self.prices[event.item_id].cents * event.quantity,
                release_reason=reason,
                deadline_at=self.moment(event.deadline_ms) if event.deadline_ms else None,
                request_id=event.request_id, idempotency_key=event.idempotency_key,
                reserved_at=at,
                paid_at=at if new_status is OrderStatus.PAID else None,
                released_at=at if new_status in RELEASED_STATUSES else None,
                payment_id=event.payment_id if new_status is OrderStatus.PAID else None,
            )  # fmt: skip
        elif isinstance(current, _NewOrder):  # born in this batch: amend the row to insert
            current.status = new_status
            if new_status is OrderStatus.PAID:
                current.paid_at = self.moment(event.at_ms)
                current.payment_id = event.payment_id
            elif current.released_at is None:  # released now; a refund keeps its release's time
                current.released_at = self.moment(event.at_ms)
            current.release_reason = current.release_reason or reason
        else:
            advance = self.advances.get(event.order_id)
            if advance is None:
                advance = self.advances[event.order_id] = _Advance(
                    event.order_id, current.status, new_status
                )
            advance.status = current.status = new_status
            if new_status is OrderStatus.PAID and advance.paid_at is None:
                advance.paid_at = self.moment(event.at_ms)
                advance.payment_id = event.payment_id
            elif new_status in RELEASED_STATUSES and advance.released_at is None:
                advance.released_at = self.moment(event.at_ms)
            advance.release_reason = advance.release_reason or reason
        return moves

    def order_rows(self) -> list[tuple[Any, ...]]:
        """The new orders' rows, in id order like the locks: persisters never wait on each
        other in a cycle."""
        now = self.db_time(self.now)
        return [
            (
                order_id, o.item_id, o.buyer, o.quantity, o.price_cents, o.status.value,
                o.release_reason, o.deadline_at, o.request_id, o.idempotency_key, o.reserved_at,
                o.paid_at, o.released_at, o.payment_id, now,
            )
            for order_id, o in sorted(self.born.items())
        ]  # fmt: skip

    async def write(
        self,
        conn: AsyncConnection,
        bulk: Bulk,
        *,
        turn: Turn | None = None,
    ) -> None:
        """Every row, then (after ``turn``) the counters: the rows are the batch's own (its
        orders, locked or new; its journal entries), the counters every batch's."""
        await bulk.insert(conn, _STOCK_FLOW, _JOURNAL_COLUMNS, self.journal)
        if self.born:
            await bulk.insert(conn, ORDERS, _ORDER_COLUMNS, self.order_rows())
        if self.advances:
            # In id order, like the locks; each row is guarded by the status it moves from.
            rows = [self.advances[i].row() for i in sorted(self.advances)]
            moved = await bulk.advance(conn, rows, self.db_time(self.now))
            if moved != len(rows):
                raise BadEvent(
                    f"{len(rows) - moved} of orders {sorted(self.advances)} were not in the "
                    "status they moved from"
                )
        if self.refunds:
            await _owe_refunds(conn, list(self.refunds.values()))
        if turn is not None:
            await turn()
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


_STOCK_FLOW: Table = StockFlow.__table__  # type: ignore[assignment]


async def _owe_refunds(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    """Record refunds owed, each once per payment: a refund journaled again (a repair, a
    recovery) finds its row there already."""
    keys = [(row["item_id"], row["payment_id"]) for row in rows]
    found = await conn.execute(
        select(Refund.item_id, Refund.payment_id).where(
            tuple_(Refund.item_id, Refund.payment_id).in_(keys)
        )
    )
    known = {(r.item_id, r.payment_id) for r in found}
    fresh = [row for row, key in zip(rows, keys, strict=True) if key not in known]
    if fresh:
        await conn.execute(insert(Refund), fresh)


# Built once too: the counters' moves are bound when it runs.
_AVAILABLE, _HELD, _SOLD = (
    bindparam(f"by_{counter}", type_=Integer()) for counter in ("available", "held", "sold")
)
_MOVE_STOCK = (
    update(Inventory)
    .where(
        Inventory.item_id == bindparam("item"),
        Inventory.available + _AVAILABLE >= 0,
        Inventory.held + _HELD >= 0,
        Inventory.sold + _SOLD >= 0,
    )
    .values(
        available=Inventory.available + _AVAILABLE,
        held=Inventory.held + _HELD,
        sold=Inventory.sold + _SOLD,
        version=Inventory.version + 1,
    )
)


async def _move_stock(
    conn: AsyncConnection, item_id: int, available: int, held: int, sold: int
) -> None:
    result = await conn.execute(
        _MOVE_STOCK,
        {"item": item_id, "by_available": available, "by_held": held, "by_sold": sold},
    )
    if result.rowcount != 1:
        raise AheadOfStream(
            f"inventory of item {item_id} cannot move by available {available:+}, held "
            f"{held:+}, sold {sold:+}: a counter would go below zero"
        )
