"""The ledger on every SQL backend: idempotent, order-independent, forward-only, all or nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import socket
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from seckill.domain.events import (
    AheadOfStream,
    BadEvent,
    EventKind,
    ReleaseReason,
    StockEvent,
    decode_event,
)
from seckill.domain.items import Stock
from seckill.domain.outcomes import Outcome
from seckill.domain.times import ms_to_datetime
from seckill.engine.engine import RedisEngine
from seckill.services.reconcile.records import compare_records
from seckill.store.database import is_busy, is_race, is_transient, open_database
from seckill.store.ledger import Ledger
from seckill.store.tables import Base, Inventory, Order
from tests.conftest import ManualClock, new_item, pay

_positions = itertools.count(1)


def event(kind: EventKind, item_id: int, order_id: int | None = None, **fields: Any) -> StockEvent:
    base: dict[str, Any] = {"buyer": "alice", "quantity": 2} if order_id else {}
    if kind is EventKind.RESERVED:
        base["deadline_ms"] = 1_800_000_000_000
    return StockEvent(
        event_id=f"1700000000000-{next(_positions)}",
        kind=kind,
        item_id=item_id,
        at_ms=1_700_000_000_000,
        order_id=order_id,
        **{**base, **fields},
    )


async def test_the_migrations_build_exactly_the_models(ledger: Ledger) -> None:
    def differences(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    async with ledger.engine.connect() as conn:
        assert await conn.run_sync(differences) == []


@pytest.mark.parametrize(
    "order",
    [
        [EventKind.RESERVED, EventKind.PAID],
        [EventKind.PAID, EventKind.RESERVED],  # two persisters: the later event lands first
    ],
)
async def test_events_of_one_order_land_in_any_order(
    ledger: Ledger, order: list[EventKind]
) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=2))
    for kind in order:
        assert await ledger.apply([event(kind, item_id, 1)]) == 1
    assert await ledger.stock(item_id) == Stock(total=10, available=8, held=0, sold=2)
    assert (await ledger.orders(item_id))[1].status == "paid"


async def test_released_before_reserved_moves_nothing_twice(ledger: Ledger) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=2))
    released = event(EventKind.RELEASED, item_id, 1, reason=ReleaseReason.EXPIRED)
    reserved = event(EventKind.RESERVED, item_id, 1)
    await ledger.apply([released])
    await ledger.apply([reserved, released])  # a redelivery of the release, too
    assert await ledger.stock(item_id) == Stock(total=10, available=10, held=0, sold=0)
    order = (await ledger.orders(item_id))[1]
    assert (order.status, order.release_reason) == ("released", "expired")


async def test_a_repeated_event_is_applied_once(ledger: Ledger) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=2))
    reserved = event(EventKind.RESERVED, item_id, 1)
    assert await ledger.apply([reserved, reserved]) == 1
    assert await ledger.apply([reserved]) == 0
    assert await ledger.stock(item_id) == Stock(total=10, available=8, held=2, sold=0)
    assert await ledger.journal_size(item_id) == 1


@pytest.mark.parametrize(
    ("first", "then", "says"),
    [
        (EventKind.PAID, {"kind": EventKind.RELEASED, "reason": ReleaseReason.CANCELLED}, "paid"),
        (EventKind.RESERVED, {"kind": EventKind.PAID, "quantity": 3}, "says 3"),
        (EventKind.RESERVED, {"kind": EventKind.PAID, "buyer": "mallory"}, "mallory"),
        (
            EventKind.PAID,
            {"kind": EventKind.REFUND_REQUIRED, "reason": ReleaseReason.EXPIRED},
            "paid",
        ),
    ],
)
async def test_a_contradicting_event_is_refused_and_writes_nothing(
    ledger: Ledger, first: EventKind, then: dict[str, Any], says: str
) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=3))
    await ledger.apply([event(first, item_id, 1)])
    before = (await ledger.stock(item_id), await ledger.journal_size(item_id))
    neighbour = event(EventKind.RESERVED, item_id, 2)
    fields = dict(then)  # the parameters are shared between backends: do not mutate them
    kind = fields.pop("kind")
    with pytest.raises(BadEvent, match=says):
        await ledger.apply([neighbour, event(kind, item_id, 1, **fields)])
    assert (await ledger.stock(item_id), await ledger.journal_size(item_id)) == before
    assert 2 not in await ledger.orders(item_id)  # the whole batch rolled back


async def test_an_event_for_an_item_sql_does_not_know_is_refused(ledger: Ledger) -> None:
    with pytest.raises(BadEvent, match="items SQL does not know"):
        await ledger.apply([event(EventKind.RESERVED, 424242, 1)])


async def test_loaded_events_move_the_total_once_and_newest_wins(ledger: Ledger) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=2))
    await ledger.apply([event(EventKind.RESERVED, item_id, 1)])
    older = event(EventKind.LOADED, item_id, total=15)
    newer = event(EventKind.LOADED, item_id, total=20)
    await ledger.apply([newer])
    await ledger.apply([older, newer])  # older arrives late; newer again
    assert await ledger.stock(item_id) == Stock(total=20, available=18, held=2, sold=0)


async def test_constraint_failures_blame_the_entries_and_lost_connections_do_not(
    ledger: Ledger, sql_url: str
) -> None:
    """The persister retries a batch only for errors that say nothing about its entries."""
    item_id = await ledger.create_item(new_item(total=10))
    with pytest.raises(DBAPIError) as broken_check:
        async with ledger.engine.begin() as conn:
            await conn.execute(
                update(Inventory).where(Inventory.item_id == item_id).values(total=11)
            )
    assert not is_transient(broken_check.value)
    if make_url(sql_url).get_backend_name() == "sqlite":
        return  # a file: no server to be away
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    away = open_database(make_url(sql_url).set(port=port).render_as_string(hide_password=False))
    try:
        with pytest.raises((DBAPIError, OSError)) as refused:  # asyncpg raises the OSError as is
            async with away.connect():
                pass
        assert is_transient(refused.value) and not is_busy(refused.value)  # away, not busy
    finally:
        await away.dispose()


async def test_a_key_taken_first_is_a_race_and_a_lock_wait_is_an_outage(
    ledger: Ledger, sql_url: str
) -> None:
    """What each server says when a unique key is already taken is told apart from every other
    refusal (MariaDB's errors carry a SQLSTATE that several errors share: the number decides)."""
    item_id = await ledger.create_item(new_item(total=10))
    now = datetime.now(UTC)
    row = {"id": 7, "item_id": item_id, "buyer": "b", "quantity": 1, "price_cents": 1,
           "status": "held", "reserved_at": now, "updated_at": now}  # fmt: skip
    async with ledger.engine.begin() as conn:
        await conn.execute(insert(Order).values(**row))
    with pytest.raises(DBAPIError) as taken:
        async with ledger.engine.begin() as conn:
            await conn.execute(insert(Order).values(**row))
    assert is_race(taken.value) and not is_transient(taken.value)
    with pytest.raises(DBAPIError) as broken_check:
        async with ledger.engine.begin() as conn:
            await conn.execute(update(Order).where(Order.id == 7).values(quantity=0))
    assert not is_race(broken_check.value) and not is_transient(broken_check.value)
    if make_url(sql_url).get_backend_name() != "mysql":
        return
    async with ledger.engine.connect() as holder, ledger.engine.connect() as waiter:
        await holder.execute(select(Order).where(Order.id == 7).with_for_update())
        await waiter.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
        with pytest.raises(DBAPIError) as waited:
            await waiter.execute(update(Order).where(Order.id == 7).values(quantity=2))
        assert is_transient(waited.value) and not is_race(waited.value)  # 1205, SQLSTATE HY000
        assert is_busy(waited.value)  # answered: a lock was not free in time


async def test_a_resale_ahead_of_its_release_is_refused_as_ahead_of_the_stream(
    ledger: Ledger,
) -> None:
    item_id = await ledger.create_item(new_item(total=2, limit=2))
    await ledger.apply([event(EventKind.RESERVED, item_id, 1)])  # alice holds both units
    release = event(EventKind.RELEASED, item_id, 1, reason=ReleaseReason.CANCELLED)
    resale = event(EventKind.RESERVED, item_id, 2, buyer="bob")
    with pytest.raises(AheadOfStream):
        await ledger.apply([resale])
    await ledger.apply([resale, release])  # together, in stream order: fine
    assert await ledger.stock(item_id) == Stock(total=2, available=0, held=2, sold=0)


async def test_a_batch_landed_ahead_moves_the_counters_at_its_turn_after_the_batch_before(
    ledger: Ledger,
) -> None:
    """The resale is planned and its rows written in its own transaction while the release is
    not landed yet: it waits at its turn, the release lands meanwhile (the resale's transaction
    holds nothing it needs: its own rows, not the counters), and the resale then finds the
    units back. Moving the counters at once, it would be refused."""
    if ledger.engine.dialect.name == "sqlite":  # one writer: a planning snapshot goes stale
        assert not ledger.plans_ahead
        return
    assert ledger.plans_ahead
    item_id = await ledger.create_item(new_item(total=2, limit=2))
    await ledger.apply([event(EventKind.RESERVED, item_id, 1)])  # alice holds both units
    release = event(EventKind.RELEASED, item_id, 1, reason=ReleaseReason.CANCELLED)
    resale = event(EventKind.RESERVED, item_id, 2, buyer="bob")
    planned, go = asyncio.Event(), asyncio.Event()

    async def turn() -> None:
        planned.set()
        await go.wait()

    async with asyncio.timeout(30):
        ahead = asyncio.create_task(ledger.apply([resale], turn=turn))
        await planned.wait()
        assert await ledger.apply([release]) == 1
        assert [o.status for o in (await ledger.orders(item_id)).values()] == ["released"]
        go.set()
        assert await ahead == 1
    assert await ledger.stock(item_id) == Stock(total=2, available=0, held=2, sold=0)


# -- refunds, from the events a real engine writes ------------------------------------------------
# A payment after its hold was released: the stream carries reserved, released, refund_required
# (in that order, but two persisters may land them in any). Each landing is a list of batches.
REFUND_LANDINGS = {
    "refund first": [["refund_required"], ["reserved"], ["released"]],
    "refund before release": [["reserved"], ["refund_required"], ["released"]],
    "refund before release, one batch": [["reserved", "refund_required"], ["released"]],
    "refund last": [["reserved"], ["released"], ["refund_required"]],
    "all in one batch": [["reserved", "released", "refund_required"]],
    "release and refund before reserved": [["released", "refund_required"], ["reserved"]],
}


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("late", ["after a cancel", "past the deadline"])
@pytest.mark.parametrize("landing", list(REFUND_LANDINGS))
async def test_a_refund_lands_in_any_order_as_refund_required(
    ledger: Ledger, timed_engine: RedisEngine, clock: ManualClock, late: str, landing: str
) -> None:
    item_id = await ledger.create_item(new_item(total=5, limit=2, hold_seconds=1))
    sale_item = await ledger.sale_item(item_id)
    assert sale_item is not None
    await timed_engine.load_item(sale_item)
    reserved = await timed_engine.reserve(
        item_id, buyer="alice", quantity=2, idempotency_key="k", order_id=7
    )
    assert reserved.accepted
    if late == "after a cancel":
        await timed_engine.release(item_id, 7, ReleaseReason.CANCELLED)
    else:
        clock.advance(1_000)
    paid_late = await pay(timed_engine, item_id, 7)
    reason = ReleaseReason.CANCELLED if late == "after a cancel" else ReleaseReason.EXPIRED
    assert (paid_late.outcome, paid_late.reason) == (Outcome.REFUND_REQUIRED, reason)

    events = [decode_event(entry_id, f) for entry_id, f in await timed_engine.events(item_id)]
    by_kind = {e.kind.value: e for e in events}
    assert list(by_kind) == ["loaded", "reserved", "released", "refund_required"]
    await ledger.apply([by_kind["loaded"]])
    for batch in REFUND_LANDINGS[landing]:
        await ledger.apply([by_kind[kind] for kind in batch])
        stock = await ledger.stock(item_id)
        assert stock is not None and stock.balanced
    assert await ledger.apply(events) == 0  # a redelivery of everything changes nothing

    order = (await ledger.orders(item_id))[7]
    assert (order.status, order.release_reason) == ("refund_required", reason.value)
    async with ledger.engine.connect() as conn:
        released_at = (
            await conn.execute(select(Order.released_at).where(Order.id == 7))
        ).scalar_one()
    assert released_at is not None
    assert await ledger.stock(item_id) == await timed_engine.stock(item_id) == Stock(5, 5, 0, 0)
    failed = [c for c in await compare_records(timed_engine, ledger, item_id) if not c.ok]
    assert not failed, failed


async def test_a_refund_after_its_release_keeps_the_release_time(ledger: Ledger) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=2))
    released = event(EventKind.RELEASED, item_id, 1, reason=ReleaseReason.CANCELLED)
    refund = dataclasses.replace(
        event(EventKind.REFUND_REQUIRED, item_id, 1, reason=ReleaseReason.CANCELLED),
        at_ms=released.at_ms + 60_000,
    )
    await ledger.apply([event(EventKind.RESERVED, item_id, 1)])
    await ledger.apply([released])
    await ledger.apply([refund])
    async with ledger.engine.connect() as conn:
        row = (
            await conn.execute(
                select(Order.status, Order.released_at, Order.release_reason).where(Order.id == 1)
            )
        ).one()
    assert (row.status, row.release_reason) == ("refund_required", "cancelled")
    assert row.released_at == ms_to_datetime(released.at_ms)
