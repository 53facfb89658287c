"""Landing's bulk writes on every SQL backend: each driver's fast path stores exactly what
SQLAlchemy's own statements would, and a refusal inside one blames the entries, atomically."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError

from seckill.domain.events import EventKind, ReleaseReason, StockEvent
from seckill.domain.items import Stock
from seckill.domain.times import ms_to_datetime
from seckill.store.database import is_transient
from seckill.store.ledger import Ledger
from seckill.store.tables import Order, StockFlow
from tests.conftest import new_item

AT_MS = 1_700_000_000_123  # milliseconds that a lossy time conversion would not keep
DEADLINE_MS = 1_700_000_060_456
_sequence = itertools.count(1)


def event(kind: EventKind, item_id: int, *, shard: int = 0, **fields: Any) -> StockEvent:
    return StockEvent(
        event_id=f"{AT_MS}-{next(_sequence)}",
        kind=kind,
        item_id=item_id,
        shard=shard,
        at_ms=fields.pop("at_ms", AT_MS),
        **fields,
    )


async def test_every_value_of_a_batch_lands_as_written(ledger: Ledger) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=3, price_cents=250))
    reserved = dict(buyer="alice", quantity=2, deadline_ms=DEADLINE_MS, request_id="req-1")
    batch = [
        event(EventKind.LOADED, item_id, total=10),
        event(EventKind.RESERVED, item_id, order_id=1, **reserved),
        event(EventKind.PAID, item_id, order_id=1, buyer="alice", quantity=2, at_ms=AT_MS + 1),
        # No request id, and a release that lands before its reservation.
        event(EventKind.RESERVED, item_id, order_id=2, buyer="bob", quantity=1,
              deadline_ms=DEADLINE_MS),
        event(EventKind.RELEASED, item_id, order_id=3, buyer="carol", quantity=1,
              reason=ReleaseReason.EXPIRED),
        event(EventKind.TRANSFERRED_OUT, item_id, transfer_id="t-1", quantity=1),
        event(EventKind.TRANSFERRED_IN, item_id, shard=1, transfer_id="t-1", quantity=1),
    ]  # fmt: skip
    assert await ledger.apply(batch) == len(batch)

    async with ledger.engine.connect() as conn:
        orders = {
            row.id: row for row in await conn.execute(select(Order).where(Order.item_id == item_id))
        }
        journal = {
            row.event_id: row
            for row in await conn.execute(select(StockFlow).where(StockFlow.item_id == item_id))
        }
    at, deadline = ms_to_datetime(AT_MS), ms_to_datetime(DEADLINE_MS)
    columns = ("buyer", "quantity", "price_cents", "status", "release_reason", "deadline_at",
               "request_id", "reserved_at", "paid_at", "released_at")  # fmt: skip
    assert {i: tuple(getattr(row, c) for c in columns) for i, row in orders.items()} == {
        1: ("alice", 2, 500, "paid", None, deadline, "req-1", at, ms_to_datetime(AT_MS + 1),
            None),
        2: ("bob", 1, 250, "held", None, deadline, None, at, None, None),
        3: ("carol", 1, 250, "released", "expired", None, None, at, None, at),
    }  # fmt: skip
    assert all(row.updated_at.tzinfo is not None for row in orders.values())
    columns = ("shard", "event", "order_id", "quantity", "reason", "transfer_id", "at",
               "available_delta", "held_delta", "sold_delta")  # fmt: skip
    assert [tuple(getattr(journal[e.event_id], c) for c in columns) for e in batch] == [
        (0, "loaded", None, None, None, None, at, 0, 0, 0),
        (0, "reserved", 1, 2, None, None, at, -2, 2, 0),
        (0, "paid", 1, 2, None, None, ms_to_datetime(AT_MS + 1), 0, -2, 2),
        (0, "reserved", 2, 1, None, None, at, -1, 1, 0),
        (0, "released", 3, 1, "expired", None, at, 0, 0, 0),
        (0, "transferred_out", None, 1, None, "t-1", at, 0, 0, 0),
        (1, "transferred_in", None, 1, None, "t-1", at, 0, 0, 0),
    ]
    assert await ledger.stock(item_id) == Stock(total=10, available=7, held=1, sold=2)


@pytest.mark.parametrize("size", [1, 1000])
async def test_a_bulk_write_the_database_refuses_blames_the_entries_and_writes_nothing(
    ledger: Ledger, size: int
) -> None:
    """A journal row already there for an order with no row (written by hand here) makes the
    bulk insert fail: an error about the rows, never an outage to wait out."""
    item_id = await ledger.create_item(new_item(total=size + 1))
    batch = [
        event(EventKind.RESERVED, item_id, order_id=order_id, buyer=f"b{order_id}", quantity=1,
              deadline_ms=DEADLINE_MS)
        for order_id in range(1, size + 2)
    ]  # fmt: skip
    clash = batch[-1]
    async with ledger.engine.begin() as conn:
        await conn.execute(
            insert(StockFlow).values(
                item_id=item_id, shard=0, event_id=clash.event_id, event="reserved",
                order_id=clash.order_id, quantity=1, at=ms_to_datetime(AT_MS),
                available_delta=0, held_delta=0, sold_delta=0,
            )
        )  # fmt: skip
    with pytest.raises(DBAPIError) as refused:
        await ledger.apply(batch)
    assert not is_transient(refused.value)
    assert await ledger.orders(item_id) == {}
    assert await ledger.journal_size(item_id) == 1
    assert await ledger.stock(item_id) == Stock(total=size + 1, available=size + 1, held=0, sold=0)


async def test_orders_on_record_move_together_each_time_set_once(ledger: Ledger) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=1))

    def of(order_id: int, kind: EventKind, at_ms: int, **fields: Any) -> StockEvent:
        return event(kind, item_id, order_id=order_id, buyer=f"b{order_id}", quantity=1,
                     at_ms=at_ms, **fields)  # fmt: skip

    await ledger.apply(
        [of(i, EventKind.RESERVED, AT_MS, deadline_ms=DEADLINE_MS) for i in (1, 2, 3)]
    )
    cancelled = ReleaseReason.CANCELLED
    await ledger.apply(
        [
            of(1, EventKind.PAID, AT_MS + 1),
            # Released, then paid too late: one move from held, the release's time and reason.
            of(2, EventKind.RELEASED, AT_MS + 2, reason=cancelled),
            of(2, EventKind.REFUND_REQUIRED, AT_MS + 3, reason=cancelled),
        ]
    )
    await ledger.apply([of(3, EventKind.RELEASED, AT_MS + 4, reason=ReleaseReason.EXPIRED)])

    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            select(
                Order.id, Order.status, Order.paid_at, Order.released_at, Order.release_reason
            ).where(Order.item_id == item_id)
        )
        orders = {row.id: tuple(row)[1:] for row in rows}
    assert orders == {
        1: ("paid", ms_to_datetime(AT_MS + 1), None, None),
        2: ("refund_required", None, ms_to_datetime(AT_MS + 2), "cancelled"),
        3: ("released", None, ms_to_datetime(AT_MS + 4), "expired"),
    }
    assert await ledger.stock(item_id) == Stock(total=10, available=9, held=0, sold=1)
