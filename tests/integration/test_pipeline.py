"""Stream to SQL: every accepted reservation lands once, whatever the order and repetitions."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy import select

from benchmarks.tcp_proxy import TcpProxy
from seckill.domain.events import ReleaseReason, decode_event
from seckill.domain.holds import HoldState
from seckill.domain.ids import OrderIds
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.engine.streams import GROUP, stream_drained
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.services.reconcile.records import compare_records
from seckill.store.ledger import Ledger
from seckill.store.tables import Inventory
from seckill.workers.persister import Persister
from tests.conftest import new_item, pay, redis7_binary
from tests.support.redis_servers import free_port
from tests.support.sales import FAST, Sale, assert_sql_matches_redis, drain
from tests.support.sales import sale as sale  # the fixture: an item on sale

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")


async def test_a_batch_read_ahead_lands_meanwhile_and_moves_the_counters_after_the_one_before(
    engine: RedisEngine, ledger: Ledger, redis: Redis, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Four units sold, released and sold again, three times, read four entries at a time: each
    batch of resales begins landing (its transaction planned, its rows written) while the
    releases before it land, and moves the counters only after them (moved at once, SQL would
    have no unit to sell yet)."""
    item_id = await ledger.create_item(new_item(total=4, limit=1))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(7))
    await drain(sale)  # the load: every batch after it is four sales, or their four releases
    for round_ in range(3):
        sold = [await sale.buy(f"b{round_}-{n}") for n in range(4)]
        assert all(sold) and await sale.buy("late") is None
        for order_id in sold:
            assert order_id
            await engine.release(item_id, order_id, ReleaseReason.CANCELLED)
    turns: list[bool] = []
    apply = ledger.apply

    async def watched_apply(events: Any, *, turn: Any = None) -> int:
        turns.append(turn is not None)
        return await apply(events, turn=turn)

    monkeypatch.setattr(ledger, "apply", watched_apply)
    persister = sale.persister(batch_size=4)
    with caplog.at_level("INFO", logger="seckill.workers.persister"):
        await drain(sale, persister)
    await assert_sql_matches_redis(sale)
    assert persister.landed == 24
    if ledger.plans_ahead:  # the sales of rounds 2 and 3 began while the releases landed
        assert sum(turns) >= 2
    else:
        assert not any(turns)
    assert not [r for r in caplog.records if "afresh" in r.message or "waits for" in r.message]


async def test_a_batch_begun_ahead_of_a_batch_that_stalled_rolls_back(
    engine: RedisEngine, ledger: Ledger, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch's stock update waits 1.5 s on a lock held here (a database that stalls):
    the batch read ahead meanwhile has written its rows but rolls them back at its turn (read
    that long ago, Redis may have lost it since); it is read again and lands on the next pass."""
    if not ledger.plans_ahead:
        return  # one writer: nothing begins ahead (see the test above)
    item_id = await ledger.create_item(new_item(total=8, limit=1))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(7))
    await drain(sale)
    assert all([await sale.buy(f"b{n}") for n in range(8)])  # two batches of four
    outcomes: list[str] = []
    apply = ledger.apply

    async def watched_apply(events: Any, *, turn: Any = None) -> int:
        try:
            new = await apply(events, turn=turn)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
            raise
        outcomes.append("landed")
        return new

    monkeypatch.setattr(ledger, "apply", watched_apply)
    persister = sale.persister(batch_size=4)
    async with ledger.engine.connect() as holder:
        await holder.execute(
            select(Inventory).where(Inventory.item_id == item_id).with_for_update()
        )
        stall = asyncio.get_running_loop().call_later(1.5, asyncio.ensure_future, holder.rollback())
        assert await persister.run_once() == 4  # the first batch, 1.5 s late; the second dropped
        stall.cancel()
    # Given up at its turn: the batch before stalled (or, on a slow machine, its turn took
    # longer than a batch begun ahead waits).
    assert outcomes[0] == "landed" and outcomes[1:] in (["_Stalled"], ["TimeoutError"])
    await drain(sale, persister)
    await assert_sql_matches_redis(sale)
    assert persister.landed == 8


async def test_2000_reservations_paid_and_released_land_one_to_one(sale: Sale) -> None:
    rng = random.Random(1)
    order_ids = await asyncio.gather(*(sale.buy(f"b{n}", rng.choice((1, 2))) for n in range(2_000)))
    held = [o for o in order_ids if o]
    assert held
    for order_id in held:
        fate = rng.random()
        if fate < 0.5:
            await pay(sale.engine, sale.item_id, order_id)
        elif fate < 0.8:
            await sale.engine.release(sale.item_id, order_id, ReleaseReason.CANCELLED)
    await drain(sale)
    await assert_sql_matches_redis(sale)
    holds = (await sale.engine.holds(sale.item_id)).values()
    assert {h.state for h in holds} == {HoldState.HELD, HoldState.PAID, HoldState.RELEASED}
    # one journal row per event: loaded, one reserved per hold, one paid or released per settled
    settled = sum(h.state is not HoldState.HELD for h in holds)
    assert await sale.ledger.journal_size(sale.item_id) == 1 + len(holds) + settled


async def test_many_items_land_through_persisters_sharing_the_group(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    """Streams on every node of a cluster (or one Redis), two persisters in one group, a busy
    item beside quiet ones: every event lands once, each item's record equals its Redis."""
    rng = random.Random(3)
    item_ids = [await ledger.create_item(new_item(total=400, limit=2)) for _ in range(9)]
    for item_id in item_ids:
        await warm_item(engine, ledger, item_id)
    if isinstance(redis, RedisCluster):
        nodes = {redis.get_node_from_key(engine.keys(i).events).name for i in item_ids}
        assert len(nodes) == 3, "the items' streams must be spread over every primary"
    ids = OrderIds(6)
    busy, *quiet = item_ids
    buyers = [(busy, f"b{n}") for n in range(600)] + [(i, "q") for i in quiet]
    answers = await asyncio.gather(
        *(
            engine.reserve(i, buyer=b, quantity=1, idempotency_key="k", order_id=ids.next())
            for i, b in buyers
        )
    )
    held = [(i, a.order_id) for (i, _), a in zip(buyers, answers, strict=True) if a.order_id]
    assert len(held) == 400 + len(quiet)
    for item_id, order_id in held:
        if rng.random() < 0.5:
            await pay(engine, item_id, order_id)
        else:
            await engine.release(item_id, order_id, ReleaseReason.CANCELLED)

    persisters = [
        Persister(redis=redis, ledger=ledger, config=FAST, prefix=DEFAULT_PREFIX) for _ in range(2)
    ]
    async with asyncio.timeout(60):
        while not all([await stream_drained(redis, engine.keys(i).events) for i in item_ids]):
            await asyncio.gather(*(p.run_once() for p in persisters))
    assert all(p.landed for p in persisters), "the two persisters shared the work"
    # one journal row per event (loaded, reserved, then paid or released): each landed once
    journal = [await ledger.journal_size(i) for i in item_ids]
    assert sum(journal) == len(item_ids) + 2 * len(held)
    for item_id in item_ids:
        failed = [c for c in await compare_records(engine, ledger, item_id) if not c.ok]
        assert not failed, (item_id, failed)


@pytest.mark.redis_variants("redis7")
async def test_four_persisters_landing_one_orders_events_apart_never_collide(sale: Sale) -> None:
    """Buyers who pay at once: an order's `reserved` and `paid` often land in two batches of two
    persisters at the same moment, each about to insert the order's row. The one that finds the
    key taken tries again at once and finds the other's row: nothing is blamed, nothing waits
    to be claimed (which here would take ten minutes: the drain would time out)."""
    rng = random.Random(5)

    async def buyer(n: int) -> None:
        order_id = await sale.buy(f"b{n}")
        if order_id is not None and rng.random() < 0.6:
            await pay(sale.engine, sale.item_id, order_id)

    persisters = [
        sale.persister(batch_size=1, linger_ms=0, claim_idle_ms=600_000, max_deliveries=1)
        for _ in range(4)
    ]
    landing = asyncio.create_task(drain(sale, *persisters, limit_s=600))
    await asyncio.gather(*(buyer(n) for n in range(600)))
    last_request = time.monotonic()
    await drain(sale, *persisters, limit_s=60)
    landing.cancel()
    assert [p.dead_lettered for p in persisters] == [0, 0, 0, 0]
    await assert_sql_matches_redis(sale)
    races = sum(p.races for p in persisters)
    print(
        f"{races} batches met another persister's new order and landed on a second try; "
        f"SQL == Redis {time.monotonic() - last_request:.2f} s after the last request"
    )


@pytest.mark.redis_variants("redis7")
async def test_after_redis_failed_a_persister_lands_its_own_pending_entries_first(
    ledger: Ledger,
) -> None:
    """As after a failover to a replica that missed the acknowledgements: entries this
    consumer was given are pending again. They land on the first pass after the failure, not
    once they have been idle for claim_idle_ms."""
    with RedisServer(binary=redis7_binary(), port=free_port()) as server:
        redis = Redis.from_url(server.url, decode_responses=True)
        proxy = TcpProxy("127.0.0.1", server.port or 0)
        await proxy.start()
        # No retries: the pass fails at the cut, not after redis-py's default three tries with
        # backoff (3.5 s of refused connections); the failure the persister sees is the same.
        through_proxy = Redis(port=proxy.port, decode_responses=True, retry=Retry(NoBackoff(), 0))
        try:
            scripts = Scripts(redis)
            engine = RedisEngine(
                redis, scripts=scripts, idempotency_ttl_ms=60_000, prefix=DEFAULT_PREFIX
            )
            item_id = await ledger.create_item(new_item(total=10))
            await warm_item(engine, ledger, item_id)
            persister = Persister(
                redis=through_proxy, ledger=ledger, consumer="p1",
                config=dataclasses.replace(FAST, claim_idle_ms=600_000),
                prefix=DEFAULT_PREFIX,
            )  # fmt: skip
            assert await persister.run_once() == 1  # follows the stream; lands "loaded"
            sale = Sale(engine, ledger, redis, item_id, OrderIds(7))
            ordered = [await sale.buy(f"b{n}") for n in range(5)]
            stream = engine.keys(item_id).events
            await redis.xreadgroup(GROUP, "p1", {stream: ">"})  # given to p1, never acked
            proxy.cut()
            with pytest.raises(RedisConnectionError):
                await persister.run_once()
            proxy.restore()
            assert await persister.run_once() == 5  # from its own pending list, at once
            assert await stream_drained(redis, stream)
            assert set(await ledger.orders(item_id)) == set(ordered)
        finally:
            await through_proxy.aclose()
            await redis.aclose()
            await proxy.stop()


async def test_entries_delivered_1_to_5_times_land_once(sale: Sale) -> None:
    """Claims and replays: every entry is handed to the ledger 1 to 5 times, in any order."""
    rng = random.Random(2)
    for n in range(300):
        order_id = await sale.buy(f"b{n}")
        assert order_id
        if n % 3 == 0:
            await pay(sale.engine, sale.item_id, order_id)
        elif n % 3 == 1:
            await sale.engine.release(sale.item_id, order_id, ReleaseReason.EXPIRED)
    stream = sale.engine.keys(sale.item_id).events
    entries = await sale.redis.xrange(stream)
    events = [decode_event(entry_id, fields) for entry_id, fields in entries]
    deliveries = [e for e in events for _ in range(rng.randint(1, 5))]
    rng.shuffle(deliveries)
    for start in range(0, len(deliveries), 97):  # uneven batches, in shuffled order
        await sale.ledger.apply(deliveries[start : start + 97])
    await drain(sale)  # and the persister's own delivery on top
    await assert_sql_matches_redis(sale)
    assert await sale.ledger.journal_size(sale.item_id) == len(events)


async def test_a_poison_entry_becomes_a_dead_letter_and_its_neighbours_land(sale: Sale) -> None:
    stream = sale.engine.keys(sale.item_id).events
    before = await sale.buy("before")
    poison = await sale.redis.xadd(stream, {"event": "reserved", "item_id": str(sale.item_id)})
    after = await sale.buy("after")
    persister = sale.persister(max_deliveries=3)
    await drain(sale, persister)
    letters = await sale.ledger.dead_letters()
    assert [(d.stream, d.entry_id, d.deliveries) for d in letters] == [(stream, poison, 3)]
    assert "without" in letters[0].error  # says which fields were missing
    orders = await sale.ledger.orders(sale.item_id)
    assert before in orders and after in orders
    dead = await sale.redis.xrange(sale.engine.keys(sale.item_id).dead_letters)
    assert [fields["dead_entry_id"] for _, fields in dead] == [poison]
    assert persister.dead_lettered == 1


async def test_quiet_consumers_with_nothing_pending_are_forgotten(sale: Sale) -> None:
    stream = sale.engine.keys(sale.item_id).events
    for n in range(3):
        await sale.buy(f"b{n}")
    persister = sale.persister(forget_consumer_idle_ms=100)
    await drain(sale, persister)
    await sale.redis.xreadgroup(GROUP, "gone-quiet", {stream: ">"})  # nothing left to read
    await sale.buy("late")
    await sale.redis.xreadgroup(GROUP, "holds-one", {stream: ">"}, count=1)  # never acks
    await asyncio.sleep(0.15)
    await persister.trim()
    names = {c["name"] for c in await sale.redis.xinfo_consumers(stream, GROUP)}
    assert names == {persister.consumer, "holds-one"}


async def test_acknowledged_entries_are_trimmed(sale: Sale) -> None:
    for n in range(50):
        await sale.buy(f"b{n}")
    stream = sale.engine.keys(sale.item_id).events
    persister = sale.persister()
    await drain(sale, persister)
    await persister.trim()
    assert await sale.redis.xlen(stream) <= 1
    await assert_sql_matches_redis(sale)
    group = (await sale.redis.xinfo_groups(stream))[0]
    assert group["name"] == GROUP and group["pending"] == 0


async def test_a_resale_landing_before_its_release_waits_instead_of_dying(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    """alice releases 2 units, bob buys them; bob's event must not die while alice's is away."""
    item_id = await ledger.create_item(new_item(total=2, limit=2))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(6))
    alice = await sale.buy("alice", 2)
    assert alice
    await drain(sale)
    await engine.release(item_id, alice, ReleaseReason.CANCELLED)
    assert await sale.buy("bob", 2)
    stream = engine.keys(item_id).events
    # A peer takes alice's release and stalls (it keeps touching the entry, so it never idles).
    [(_, [(release_id, _)])] = await redis.xreadgroup(GROUP, "peer", {stream: ">"}, count=1)
    persister = sale.persister(max_deliveries=2, claim_idle_ms=100)
    for _ in range(6):  # bob's entry is delivered well past max_deliveries meanwhile
        await redis.xclaim(stream, GROUP, "peer", min_idle_time=0, message_ids=[release_id])
        await persister.run_once()
        await asyncio.sleep(0.15)
    assert await ledger.dead_letters() == []
    assert set(await ledger.orders(item_id)) == {alice}
    await drain(sale, persister)  # the peer is gone: its entry is claimed, and lands first
    await assert_sql_matches_redis(sale)
    assert await ledger.dead_letters() == []
