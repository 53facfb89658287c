"""Archiving (real Redis and SQL): a settled item leaves Redis in one step, refused while
anything is unsettled; afterwards every read answers from SQL, and a late payment is never
accepted as paid."""

from __future__ import annotations

import asyncio
import random
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import select

from seckill.domain.dead_letters import dead_letter_fields
from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.items import NewItem, Stock
from seckill.domain.lifecycle import Stage, Unsettled
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.shards import home_shard
from seckill.engine.cluster import RedisClient
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, items_registry, upkeep_lock_key
from seckill.engine.scripts import ScriptName, Scripts
from seckill.redis_server import RedisServer
from seckill.services.archive import Archivist
from seckill.services.dead_letters import drop_dead_letters, list_dead_letters
from seckill.services.items import item_counters, warm_item
from seckill.services.orders import OrderBook, OrderNotFound
from seckill.services.reconcile.reconciler import Reconciler
from seckill.services.reconcile.records import audit_records
from seckill.services.reconcile.recovery import recover_item
from seckill.store.ledger import Ledger
from seckill.store.tables import Payment
from seckill.workers.archiver import Archiver
from seckill.workers.persister import Persister, PersisterConfig
from tests.conftest import ManualClock

PRICE = Money(500, "USD")  # the archived item's, for its one unit

# Every variant for what depends on the server (the script, the streams, the slots); Redis 7
# alone for what is the same logic on each.
EVERY_REDIS = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")
pytestmark = pytest.mark.redis_variants("redis7")

# A test's sale is over by the wall clock, which the archivist reads (SQL's window against
# datetime.now), from its creation on: its engine decides on a clock of the test's own, BEHIND
# the wall clock, inside the window while buyers buy and pay, and end_sale() moves that clock
# past the end. So no test waits for a sale to end, but the two that watch one end in real time
# (archiving refused while it is on sale, then for what it left), on Redis's clock.
SALE_S = 1.5  # each test's sale ends this long after it was created, on its engine's clock
BEHIND = timedelta(hours=1)


@pytest.fixture
def clock() -> ManualClock:
    """The engine's clock: BEHIND the wall clock until a test moves it."""
    return ManualClock(int((datetime.now(UTC) - BEHIND).timestamp() * 1000))


@pytest.fixture
def engine(timed_engine: RedisEngine) -> RedisEngine:
    """The tests' engine, on ``clock``."""
    return timed_engine


@pytest.fixture
def real_time_engine(redis: RedisClient, scripts: Scripts) -> RedisEngine:
    """An engine on Redis TIME, as in production, for a sale that ends in real time."""
    return RedisEngine(redis, scripts=scripts, idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX)


def engine_now(engine: RedisEngine) -> datetime:
    """Now on the engine's clock (the wall clock's, for an engine on Redis TIME)."""
    now_ms = engine.now_arg()
    return datetime.fromtimestamp(int(now_ms) / 1000, UTC) if now_ms else datetime.now(UTC)


async def new_sale(
    engine: RedisEngine,
    ledger: Ledger,
    *,
    total: int = 10,
    hold_seconds: int = 60,
    shards: int = 1,
    lasts_s: float = SALE_S,
) -> int:
    now = engine_now(engine)
    item_id = await ledger.create_item(
        NewItem(
            name="Archived item", price_cents=500, total=total,
            starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(seconds=lasts_s),
            per_buyer_limit=1, hold_seconds=hold_seconds, stock_shards=shards,
        )
    )  # fmt: skip
    assert await warm_item(engine, ledger, item_id) is Outcome.LOADED
    return item_id


async def buy(engine: RedisEngine, item_id: int, buyer: str, order_id: int) -> None:
    reserved = await engine.reserve(
        item_id, buyer=buyer, quantity=1, idempotency_key=f"k-{buyer}", order_id=order_id
    )
    assert reserved.outcome is Outcome.RESERVED, reserved


async def pay(engine: RedisEngine, item_id: int, order_id: int) -> None:
    paid = await engine.settle_payment(
        item_id,
        order_id,
        payment_id=f"pay-{order_id}",
        succeeded=True,
        charged=PRICE,
        unit_price=PRICE,
    )
    assert paid.outcome is Outcome.PAID


async def sell_paid(engine: RedisEngine, item_id: int, orders: int) -> None:
    """``orders`` buyers each buy one unit and pay for it."""
    for n in range(1, orders + 1):
        await buy(engine, item_id, f"buyer-{n}", order_id=item_id * 100 + n)
        await pay(engine, item_id, item_id * 100 + n)


async def until_ended(ledger: Ledger, item_id: int) -> None:
    """Wait for the item's sale to end (on an engine on Redis TIME)."""
    record = await ledger.item(item_id)
    assert record is not None
    wait = (record.ends_at - datetime.now(UTC)).total_seconds()
    await asyncio.sleep(max(wait, 0) + 0.05)


async def end_sale(clock: ManualClock, ledger: Ledger, item_id: int) -> None:
    """The item's sale ends on the engine's clock (by the wall clock it has already)."""
    record = await ledger.item(item_id)
    assert record is not None and record.ends_at < datetime.now(UTC)
    clock.now_ms = max(clock.now_ms, int(record.ends_at.timestamp() * 1000) + 50)


async def land(redis: RedisClient, ledger: Ledger) -> None:
    """Run a persister until a pass finds nothing."""
    persister = Persister(
        redis=redis,
        ledger=ledger,
        consumer="test",
        config=PersisterConfig(block_ms=10),
        prefix=DEFAULT_PREFIX,
    )
    quiet = 0
    while quiet < 2:
        quiet = quiet + 1 if await persister.run_once() == 0 else 0


async def keys_of(redis: RedisClient, item_id: int) -> list[str]:
    """Every key of the item, of every stock shard."""
    patterns = (f"*{{item:{item_id}}}*", f"*{{item:{item_id}:s*")
    return sorted([k for p in patterns async for k in redis.scan_iter(match=p, count=1000)])


def archivist(engine: RedisEngine, ledger: Ledger) -> Archivist:
    return Archivist(engine=engine, ledger=ledger, grace=timedelta(0))


async def settled_sale(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock | None = None
) -> int:
    """A sale run to its end: three orders paid, two released by the buyers, all landed.
    Ended by moving ``clock``, the engine's; without one (an engine on Redis TIME) by waiting."""
    item_id = await new_sale(engine, ledger)
    for n in range(1, 6):
        await buy(engine, item_id, f"buyer-{n}", order_id=item_id * 100 + n)
    for n in (1, 2, 3):
        await pay(engine, item_id, item_id * 100 + n)
    for n in (4, 5):
        await engine.release(item_id, item_id * 100 + n, ReleaseReason.CANCELLED)
    if clock is None:
        await until_ended(ledger, item_id)
    else:
        await end_sale(clock, ledger, item_id)
    await land(redis, ledger)
    return item_id


@EVERY_REDIS
async def test_a_settled_sale_leaves_redis_and_sql_answers_for_it(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    item_id = await settled_sale(redis, engine, ledger, clock)
    # Idempotency records (and rate windows) are swept with it, though they would expire.
    assert any(":idem:" in k for k in await keys_of(redis, item_id))
    archive = archivist(engine, ledger)
    assert (await archive.settlement(item_id)).stage is Stage.SETTLED

    done = await archive.archive(item_id)

    assert (done.stage, done.removed, done.hindrances) == (Stage.ARCHIVED, True, [])
    assert await keys_of(redis, item_id) == []
    assert str(item_id) not in await redis.smembers(items_registry(DEFAULT_PREFIX))  # type: ignore[misc]
    assert item_id not in await engine.item_ids()
    settlement = await archive.settlement(item_id)
    assert settlement.stage is Stage.ARCHIVED and settlement.archived_at is not None
    # Every read answers from SQL.
    orders = OrderBook(engine=engine, ledger=ledger)
    paid = await orders.buyers_order("buyer-1", item_id, item_id * 100 + 1)
    assert paid.status is OrderStatus.PAID
    released = await orders.buyers_order("buyer-4", item_id, item_id * 100 + 4)
    assert (released.status, released.release_reason) == (OrderStatus.RELEASED, "cancelled")
    counters = await item_counters(engine, ledger, item_id)
    assert (counters.redis, counters.sql) == (None, Stock(total=10, available=7, held=0, sold=3))
    checks = await audit_records(engine, ledger, item_id)
    assert checks and all(c.ok for c in checks), checks
    report = await Reconciler(engine, ledger, grace_ms=0).reconcile(item_id, repair=True)
    assert (report.found, report.repairs) == ([], [])
    # A buyer cancelling again is told what happened, from SQL.
    transition, _ = await orders.cancel("buyer-1", item_id, item_id * 100 + 1)
    assert transition.outcome is Outcome.ALREADY_PAID
    # Nothing puts it back in Redis by mistake.
    for refused in (warm_item(engine, ledger, item_id), recover_item(engine, ledger, item_id)):
        with pytest.raises(InvalidRequest) as caught:
            await refused
        assert caught.value.code is ErrorCode.ITEM_ARCHIVED
    assert await keys_of(redis, item_id) == []
    # Archiving again changes nothing.
    assert (await archive.archive(item_id)).removed


async def test_a_late_payment_after_archiving_is_a_refund_and_moves_no_stock(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    item_id = await settled_sale(redis, engine, ledger, clock)
    assert (await archivist(engine, ledger).archive(item_id)).removed
    orders = OrderBook(engine=engine, ledger=ledger)
    before = await ledger.stock(item_id)
    cancelled = item_id * 100 + 4

    late, view = await orders.settle_payment(
        item_id, cancelled, payment_id="late-1", succeeded=True, charged=PRICE
    )

    assert (late.outcome, late.reason, late.replayed) == (
        Outcome.REFUND_REQUIRED, ReleaseReason.CANCELLED, False
    )  # fmt: skip
    assert view.status is OrderStatus.REFUND_REQUIRED
    assert await ledger.stock(item_id) == before
    again, _ = await orders.settle_payment(
        item_id, cancelled, payment_id="late-1", succeeded=True, charged=PRICE
    )
    assert (again.outcome, again.replayed) == (Outcome.REFUND_REQUIRED, True)
    with pytest.raises(InvalidRequest) as reused:
        await orders.settle_payment(
            item_id, cancelled, payment_id="late-1", succeeded=False, charged=PRICE
        )
    assert reused.value.code is ErrorCode.PAYMENT_ID_REUSED
    failed, _ = await orders.settle_payment(
        item_id, cancelled, payment_id="late-2", succeeded=False, charged=PRICE
    )
    assert failed.outcome is Outcome.ALREADY_RELEASED
    # The notices Redis answered before archiving moved to SQL: a retry gets the same answer.
    replayed, _ = await orders.settle_payment(
        item_id,
        item_id * 100 + 1,
        payment_id=f"pay-{item_id * 100 + 1}",
        succeeded=True,
        charged=PRICE,
    )
    assert (replayed.outcome, replayed.replayed) == (Outcome.PAID, True)
    # The refund is in the journal, and SQL still agrees with itself.
    assert (await ledger.journal_kinds(item_id))["refund_required"] == 1
    assert all(c.ok for c in await audit_records(engine, ledger, item_id))
    assert await ledger.stock(item_id) == before
    assert await keys_of(redis, item_id) == []


async def assert_live_and_whole(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, item_id: int, keys: list[str]
) -> None:
    assert await ledger.archived_at(item_id) is None
    assert item_id in await engine.item_ids()
    assert await keys_of(redis, item_id) == keys


async def test_archiving_is_refused_while_a_hold_is_held(
    redis: RedisClient, real_time_engine: RedisEngine, ledger: Ledger
) -> None:
    engine = real_time_engine
    item_id = await new_sale(engine, ledger, hold_seconds=600)
    await buy(engine, item_id, "slow-payer", order_id=item_id * 100 + 1)
    archive = archivist(engine, ledger)
    refused = await archive.archive(item_id)
    assert refused.stage is Stage.ON_SALE
    assert [h.reason for h in refused.hindrances] == [Unsettled.NOT_ENDED]
    await until_ended(ledger, item_id)
    await land(redis, ledger)
    keys = await keys_of(redis, item_id)

    refused = await archive.archive(item_id)

    assert (refused.stage, refused.removed) == (Stage.ENDED, False)
    assert [h.reason for h in refused.hindrances] == [Unsettled.HELD]
    await assert_live_and_whole(redis, engine, ledger, item_id, keys)
    # Paid: settled, archived.
    await pay(engine, item_id, item_id * 100 + 1)
    await land(redis, ledger)
    assert (await archive.archive(item_id)).removed


async def test_archiving_is_refused_while_the_stream_has_a_backlog(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    item_id = await new_sale(engine, ledger)
    await land(redis, ledger)  # the persister's group exists, and is behind from here on
    await buy(engine, item_id, "buyer", order_id=item_id * 100 + 1)
    await pay(engine, item_id, item_id * 100 + 1)
    await end_sale(clock, ledger, item_id)
    keys = await keys_of(redis, item_id)

    refused = await archivist(engine, ledger).archive(item_id)

    assert [h.reason for h in refused.hindrances] == [Unsettled.BACKLOG]
    assert "persister 2" in refused.hindrances[0].detail
    await assert_live_and_whole(redis, engine, ledger, item_id, keys)
    await land(redis, ledger)
    assert (await archivist(engine, ledger).archive(item_id)).removed


async def test_archiving_is_refused_with_a_dead_letter_not_replayed(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    item_id = await settled_sale(redis, engine, ledger, clock)
    stream = engine.keys(item_id).events
    await ledger.add_dead_letter(
        stream=stream, entry_id="1-1", payload={"event": "nonsense"}, error="bad", deliveries=5
    )
    keys = await keys_of(redis, item_id)

    refused = await archivist(engine, ledger).archive(item_id)

    assert [h.reason for h in refused.hindrances] == [Unsettled.DEAD_LETTERS]
    await assert_live_and_whole(redis, engine, ledger, item_id, keys)
    [letter] = await ledger.dead_letters()
    await ledger.mark_replayed(int(letter.id))
    assert (await archivist(engine, ledger).archive(item_id)).removed


async def test_archiving_waits_for_a_bridge_letter_and_names_the_command(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    item_id = await settled_sale(redis, engine, ledger, clock)
    keys = engine.keys(item_id)
    letter = dead_letter_fields(
        {"event": "paid"}, entry_id="1-1", group="bridge-nats", error="full", deliveries=5
    )
    await redis.xadd(keys.dead_letters, cast(Any, letter))

    refused = await archivist(engine, ledger).archive(item_id)

    assert [h.reason for h in refused.hindrances] == [Unsettled.DEAD_LETTERS]
    assert "`seckill dead-letters replay --group bridge-nats`" in refused.hindrances[0].detail
    [pending] = await list_dead_letters(ledger, engine, group="bridge-nats")
    assert (await drop_dead_letters(ledger, engine, [pending.id])).ok
    assert (await archivist(engine, ledger).archive(item_id)).removed


@EVERY_REDIS
async def test_a_late_payment_answered_by_redis_mid_archiving_is_kept(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    """The notice comes between the commit in SQL and the removal: the shard's removal waits
    for its event to land, and its answer is kept in SQL for the provider's retries."""
    item_id = await settled_sale(redis, engine, ledger, clock)
    remains = await engine.shard_remains(item_id)
    await ledger.mark_archived(item_id, [])
    late = await engine.settle_payment(
        item_id,
        item_id * 100 + 5,
        payment_id="late-mid",
        succeeded=True,
        charged=PRICE,
        unit_price=PRICE,
    )
    assert late.outcome is Outcome.REFUND_REQUIRED

    assert await engine.archive_shard(item_id, 0, remains) is Unsettled.BACKLOG
    done = await archivist(engine, ledger).archive(item_id)
    assert (done.stage, done.removed) == (Stage.ARCHIVED, False)
    assert [h.reason for h in done.hindrances] == [Unsettled.BACKLOG]
    await land(redis, ledger)
    assert (await archivist(engine, ledger).archive(item_id)).removed

    orders = OrderBook(engine=engine, ledger=ledger)
    again, view = await orders.settle_payment(
        item_id, item_id * 100 + 5, payment_id="late-mid", succeeded=True, charged=PRICE
    )
    assert (again.outcome, again.replayed) == (Outcome.REFUND_REQUIRED, True)
    assert view.status is OrderStatus.REFUND_REQUIRED
    assert await ledger.stock(item_id) == Stock(total=10, available=7, held=0, sold=3)


@EVERY_REDIS
async def test_archiving_keeps_every_notice_however_odd_and_answers_them_after(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    """What a hostile or buggy provider sends: one payment id for two orders on two shards at
    once, a second charge for a paid order, two for a released one, the same payment id on
    another item, and a claim whose settling never ran (its process stopped). Archiving never
    fails on them and keeps every notice that was answered; each retry is answered from SQL as
    Redis answered it; the payment id on two items is reported for a person."""
    item_id = await new_sale(engine, ledger, total=20, shards=4)
    other = await new_sale(engine, ledger, total=5)
    buyers: dict[int, list[str]] = {shard: [] for shard in range(4)}
    for n in range(60):
        buyers[home_shard(f"b{n}", 4)].append(f"b{n}")
    orders = {}
    for name, shard in {"A": 1, "B": 2, "C": 0, "D": 3, "F": 1}.items():
        orders[name] = item_id * 100 + len(orders) + 1
        await buy(engine, item_id, buyers[shard][len(orders)], orders[name])
    await buy(engine, other, "e", other * 100 + 1)
    notices: list[tuple[int, int, str, bool]] = []  # every notice answered: (item, order, id, ok)

    async def notify(item: int, order: int, payment_id: str, succeeded: bool = True) -> Outcome:
        answer = await engine.settle_payment(
            item, order, payment_id=payment_id, succeeded=succeeded, charged=PRICE, unit_price=PRICE
        )
        notices.append((item, order, payment_id, succeeded))
        return answer.outcome

    raced = await asyncio.gather(
        engine.settle_payment(
            item_id, orders["A"], payment_id="P1", succeeded=True, charged=PRICE, unit_price=PRICE
        ),
        engine.settle_payment(
            item_id, orders["B"], payment_id="P1", succeeded=True, charged=PRICE, unit_price=PRICE
        ),
        return_exceptions=True,
    )
    winner, loser = ("A", "B") if not isinstance(raced[0], Exception) else ("B", "A")
    notices.append((item_id, orders[winner], "P1", True))
    assert await notify(item_id, orders[loser], "P7") is Outcome.PAID
    assert await notify(item_id, orders["C"], "P2") is Outcome.PAID
    assert await notify(item_id, orders["C"], "P3") is Outcome.REFUND_REQUIRED
    await engine.release(item_id, orders["D"], ReleaseReason.CANCELLED)
    assert await notify(item_id, orders["D"], "P4") is Outcome.REFUND_REQUIRED
    assert await notify(item_id, orders["D"], "P5") is Outcome.REFUND_REQUIRED
    assert await notify(other, other * 100 + 1, "P1") is Outcome.PAID  # another item's P1
    await engine.release(item_id, orders["F"], ReleaseReason.CANCELLED)
    keys = engine.keys(item_id)  # claimed on the head for F's shard, never settled there
    await engine.scripts.call(
        ScriptName.CLAIM_PAYMENT,
        (*keys.all_fixed(), keys.payments),
        (item_id, orders["F"], "P6", "succeeded", PRICE.cents, PRICE.currency, 1),
    )
    await end_sale(clock, ledger, item_id)
    await land(redis, ledger)
    for item in (item_id, other):
        done = await archivist(engine, ledger).archive(item)
        assert (done.stage, done.removed, done.hindrances) == (Stage.ARCHIVED, True, [])

    book = OrderBook(engine=engine, ledger=ledger)
    async with ledger.engine.connect() as conn:
        kept = {(r.item_id, r.payment_id) for r in await conn.execute(select(Payment))}
    assert kept == {(item, payment_id) for item, _, payment_id, _ in notices}
    for item, order, payment_id, succeeded in notices:  # the provider retries each
        again, _ = await book.settle_payment(
            item, order, payment_id=payment_id, succeeded=succeeded, charged=PRICE
        )
        assert again.replayed, (item, order, payment_id)
    with pytest.raises(InvalidRequest) as reused:
        await book.settle_payment(
            item_id, orders[loser], payment_id="P1", succeeded=True, charged=PRICE
        )
    assert reused.value.code is ErrorCode.PAYMENT_ID_REUSED
    late, view = await book.settle_payment(
        item_id, orders["F"], payment_id="P6", succeeded=True, charged=PRICE
    )
    assert (late.outcome, late.reason, late.replayed) == (
        Outcome.REFUND_REQUIRED, ReleaseReason.CANCELLED, False
    )  # fmt: skip
    assert view.status is OrderStatus.REFUND_REQUIRED
    page = await ledger.payments.refunds(item_id=item_id)
    assert sorted((r.payment_id, r.reason) for r in page.refunds) == [
        ("P3", "duplicate_charge"), ("P4", "cancelled"), ("P5", "cancelled"), ("P6", "cancelled")
    ]  # fmt: skip
    for item in (item_id, other):
        failed = [c for c in await audit_records(engine, ledger, item) if not c.ok]
        # The one charge on two items (P1) is for a person: reported on each, and only that.
        assert [c.name for c in failed] == ["SQL agrees with itself"], failed
        assert failed[0].detail.startswith("payment_on_two_items payment P1: "), failed


async def test_notices_for_an_archived_item_are_settled_in_sql(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    """After archiving, SQL settles what Redis would: a second charge for a paid order and
    each charge for a released one are refunds owed; one payment id sent for two orders at
    once pays one."""
    item_id = await settled_sale(redis, engine, ledger, clock)
    assert (await archivist(engine, ledger).archive(item_id)).removed
    book = OrderBook(engine=engine, ledger=ledger)
    paid, cancelled, also_cancelled = item_id * 100 + 1, item_id * 100 + 4, item_id * 100 + 5

    twice, view = await book.settle_payment(
        item_id, paid, payment_id="again", succeeded=True, charged=PRICE
    )
    assert (twice.outcome, twice.reason, view.status) == (
        Outcome.REFUND_REQUIRED, RefundReason.DUPLICATE_CHARGE, OrderStatus.PAID
    )  # fmt: skip
    for payment_id in ("late-1", "late-2"):
        late, _ = await book.settle_payment(
            item_id, cancelled, payment_id=payment_id, succeeded=True, charged=PRICE
        )
        assert (late.outcome, late.reason) == (Outcome.REFUND_REQUIRED, RefundReason.CANCELLED)
    raced = await asyncio.gather(
        *(
            book.settle_payment(item_id, order, payment_id="same", succeeded=True, charged=PRICE)
            for order in (cancelled, also_cancelled)
        ),
        return_exceptions=True,
    )
    refused = [r for r in raced if isinstance(r, InvalidRequest)]
    assert len(refused) == 1 and refused[0].code is ErrorCode.PAYMENT_ID_REUSED, raced
    page = await ledger.payments.refunds(item_id=item_id)
    assert sorted(r.payment_id for r in page.refunds) == ["again", "late-1", "late-2", "same"]
    assert (await ledger.journal_kinds(item_id))["refund_required"] == 4
    assert await ledger.stock(item_id) == Stock(total=10, available=7, held=0, sold=3)
    checks = await audit_records(engine, ledger, item_id)
    assert all(c.ok for c in checks), checks


async def test_an_archived_items_wrong_sums_and_unknown_orders_are_refunds_owed_in_sql(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    """After archiving, SQL answers a charge as Redis did: another sum or currency is a refund
    owed of the sum charged (the order as it was), a charge for an order nobody knows is one
    too (unknown_order), each once however often it is sent; a failure for one is unknown."""
    item_id = await settled_sale(redis, engine, ledger, clock)
    assert (await archivist(engine, ledger).archive(item_id)).removed
    book = OrderBook(engine=engine, ledger=ledger)
    paid, cancelled = item_id * 100 + 1, item_id * 100 + 4
    cases = [
        (paid, "short", Money(499, "USD"), RefundReason.AMOUNT_MISMATCH, OrderStatus.PAID),
        (cancelled, "euros", Money(500, "EUR"), RefundReason.CURRENCY_MISMATCH,
         OrderStatus.RELEASED),
        (424242, "nobody", Money(777, "JPY"), RefundReason.UNKNOWN_ORDER, None),
    ]  # fmt: skip
    for order_id, payment_id, charged, reason, status in cases:
        for replayed in (False, True):
            answer, view = await book.settle_payment(
                item_id, order_id, payment_id=payment_id, succeeded=True, charged=charged
            )
            assert (answer.outcome, answer.reason, answer.replayed) == (
                Outcome.REFUND_REQUIRED, reason, replayed
            )  # fmt: skip
            assert (view.status if view else None) == status
    with pytest.raises(OrderNotFound):
        await book.settle_payment(
            item_id, 424243, payment_id="nobody-failed", succeeded=False, charged=PRICE
        )
    page = await ledger.payments.refunds(item_id=item_id)
    owed = {r.payment_id: (r.order_id, r.buyer, r.charged) for r in page.refunds}
    assert owed == {
        "short": (paid, "buyer-1", Money(499, "USD")),
        "euros": (cancelled, "buyer-4", Money(500, "EUR")),
        "nobody": (424242, None, Money(777, "JPY")),
    }
    assert await ledger.stock(item_id) == Stock(total=10, available=7, held=0, sold=3)
    checks = await audit_records(engine, ledger, item_id)
    assert all(c.ok for c in checks), checks


@EVERY_REDIS
async def test_an_item_with_stock_shards_archives_every_shard(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    item_id = await new_sale(engine, ledger, total=12, shards=3)
    await sell_paid(engine, item_id, 8)
    await end_sale(clock, ledger, item_id)
    await land(redis, ledger)
    assert len({k.split("}")[0] for k in await keys_of(redis, item_id)}) == 3  # three slots

    assert (await archivist(engine, ledger).archive(item_id)).removed

    assert await keys_of(redis, item_id) == []
    assert await ledger.stock(item_id) == Stock(total=12, available=4, held=0, sold=8)
    assert all(c.ok for c in await audit_records(engine, ledger, item_id))


async def test_stages_through_an_items_life(
    redis: RedisClient, real_time_engine: RedisEngine, ledger: Ledger
) -> None:
    engine = real_time_engine
    now = datetime.now(UTC)
    later = await ledger.create_item(
        NewItem(
            name="Later", price_cents=1, total=1, starts_at=now + timedelta(hours=1),
            ends_at=now + timedelta(hours=2), per_buyer_limit=1, hold_seconds=60,
        )
    )  # fmt: skip
    item_id = await new_sale(engine, ledger, hold_seconds=1)
    await buy(engine, item_id, "buyer", order_id=item_id * 100 + 1)
    archive = Archivist(engine=engine, ledger=ledger, grace=timedelta(hours=1))
    stages = {record.item_id: s.stage for record, s in await archive.stages()}
    assert stages == {later: Stage.SCHEDULED, item_id: Stage.ON_SALE}
    await until_ended(ledger, item_id)
    await land(redis, ledger)
    assert (await archive.settlement(item_id)).stage is Stage.ENDED  # the hold is held
    while await engine.expire_due(item_id):  # its deadline (1 s) passed before the end
        pass
    await land(redis, ledger)
    settled = await archive.settlement(item_id)
    assert settled.stage is Stage.SETTLED
    assert [h.reason for h in settled.hindrances] == [Unsettled.IN_GRACE]
    assert not (await archive.archive(item_id)).removed  # its grace is not over
    assert (await archive.archive(item_id, waive_grace=True)).removed
    assert (await archive.settlement(item_id)).stage is Stage.ARCHIVED


@pytest.mark.redis_variants("redis7")
async def test_kill_9_mid_archiving_leaves_each_item_live_or_archived(
    redis_server: RedisServer, sql_url: str, redis: RedisClient, engine: RedisEngine,
    ledger: Ledger, clock: ManualClock,
) -> None:  # fmt: skip
    """Processes archiving 16 settled items are killed at random moments, 6 times: each item is
    then either live with every key it had, or archived (SQL answers for it; its keys, if any
    are left, go with the next archiving). Then everything archives."""
    items = [await new_sale(engine, ledger) for _ in range(16)]
    for item_id in items:
        await sell_paid(engine, item_id, 4)
    await end_sale(clock, ledger, items[-1])
    await land(redis, ledger)
    whole = {item_id: await keys_of(redis, item_id) for item_id in items}
    draw = random.Random(21)
    archived_mid = 0
    for _ in range(6):
        live = [i for i in items if await ledger.archived_at(i) is None]
        if not live:
            break
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.archive_process", redis_server.url, sql_url,
            *map(str, live), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert child.stdout is not None
        assert await child.stdout.readline() == b"ready\n"
        await asyncio.sleep(draw.uniform(0.0, 0.15))
        child.kill()
        await child.wait()
        for item_id in items:
            if await ledger.archived_at(item_id) is None:
                await assert_live_and_whole(redis, engine, ledger, item_id, whole[item_id])
            else:
                archived_mid += bool(await keys_of(redis, item_id))
                assert all(c.ok for c in await audit_records(engine, ledger, item_id))
    for item_id in items:  # the killed processes' leases lapse (here: at once)
        await redis.delete(upkeep_lock_key(f"archive:{item_id}", DEFAULT_PREFIX))
        assert (await archivist(engine, ledger).archive(item_id)).removed
        assert await keys_of(redis, item_id) == []
        assert await ledger.stock(item_id) == Stock(total=10, available=6, held=0, sold=4)
    print(f"items killed between their commit in SQL and their removal: {archived_mid}")


@EVERY_REDIS
async def test_a_running_persister_lets_an_archived_stream_go(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    """A persister that followed the item's stream before it was archived goes on landing the
    other items' entries, and never brings the archived stream back."""
    persister = Persister(
        redis=redis,
        ledger=ledger,
        consumer="long-lived",
        config=PersisterConfig(block_ms=1000),
        prefix=DEFAULT_PREFIX,
    )
    item_id = await settled_sale(redis, engine, ledger, clock)
    other = await new_sale(engine, ledger, lasts_s=60)
    for _ in range(3):
        await persister.run_once()
    blocked = asyncio.create_task(persister.run_once())  # waiting for new entries
    await asyncio.sleep(0.2)
    assert (await archivist(engine, ledger).archive(item_id)).removed
    assert await blocked == 0  # told, and it lets the stream go

    await buy(engine, other, "after", order_id=other * 100 + 1)
    for _ in range(3):
        await persister.run_once()
        await asyncio.sleep(0.6)  # past the reader's rediscovery
    await persister.run_once()

    assert (await ledger.orders(other)).keys() == {other * 100 + 1}
    assert await keys_of(redis, item_id) == []


async def test_the_archiver_archives_what_is_settled_and_finishes_what_a_crash_left(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, clock: ManualClock
) -> None:
    settled = await settled_sale(redis, engine, ledger, clock)
    half = await settled_sale(redis, engine, ledger, clock)
    await ledger.mark_archived(half, [])  # a process died right after the commit in SQL
    held = await new_sale(engine, ledger, hold_seconds=600)
    await buy(engine, held, "slow-payer", order_id=held * 100 + 1)
    on_sale = await new_sale(engine, ledger, lasts_s=3 * 3600)  # on sale by the wall clock too
    await end_sale(clock, ledger, held)
    await land(redis, ledger)
    archiver = Archiver(archivist=archivist(engine, ledger))

    await archiver.run_once()

    assert archiver.archived == 2
    assert await keys_of(redis, settled) == await keys_of(redis, half) == []
    assert sorted(await engine.item_ids()) == sorted([held, on_sale])
    assert await ledger.archived_at(held) is None
    # A grace not over yet: nothing is archived.
    patient = Archiver(archivist=Archivist(engine=engine, ledger=ledger, grace=timedelta(hours=1)))
    await pay(engine, held, held * 100 + 1)
    await land(redis, ledger)
    await patient.run_once()
    assert patient.archived == 0
    await archiver.run_once()
    assert archiver.archived == 3 and await engine.item_ids() == [on_sale]


@pytest.mark.redis_variants("redis7", "cluster")
async def test_a_sharded_item_left_half_removed_is_finished_by_a_fresh_process(
    redis: RedisClient, engine: RedisEngine, ledger: Ledger, scripts: Scripts, clock: ManualClock
) -> None:
    """Its head (shard 0, where Redis keeps the shard count) went, the other shards did not:
    a process that never saw the item takes the count from SQL and removes them all."""
    item_id = await new_sale(engine, ledger, total=12, shards=3)
    await sell_paid(engine, item_id, 6)
    await end_sale(clock, ledger, item_id)
    await land(redis, ledger)
    await ledger.mark_archived(item_id, [])
    assert await engine.archive_shard(item_id, 0, await engine.shard_remains(item_id)) is None
    assert await keys_of(redis, item_id) != []

    fresh = RedisEngine(redis, scripts=scripts, idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX)
    done = await Archivist(engine=fresh, ledger=ledger, grace=timedelta(0)).archive(item_id)

    assert done.removed
    assert await keys_of(redis, item_id) == []
