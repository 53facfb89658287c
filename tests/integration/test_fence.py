"""The fence: a stock shard sells nothing once its Redis restarted (perhaps from an older AOF) or
lost writes, until the reconciler has checked it against SQL and rebuilt what was lost; and an
item with stock shards is rebuilt whole, whichever shards were lost.

Real redis-servers of the test's own (a restart needs one), real SQL on every backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from seckill.domain.events import ReleaseReason
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.streams import GROUP, read_progress
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.services.reconcile.drift import Drift
from seckill.services.reconcile.reconciler import Reconciler
from seckill.services.reconcile.records import audit_records
from seckill.store.ledger import Ledger
from seckill.workers.persister import Persister, PersisterConfig
from seckill.workers.reconciler import ReconcilerWorker
from tests.conftest import new_item, pay, redis7_binary
from tests.support.redis_servers import connected, copy_aof, restore_aof, rewrite_aof
from tests.support.sales import Sale, drain

ids = OrderIds(321)


def reconciler(engine: RedisEngine, ledger: Ledger) -> Reconciler:
    return Reconciler(engine, ledger, grace_ms=60_000)


async def reserve(engine: RedisEngine, item_id: int, buyer: str, key: str = "k") -> Outcome:
    answer = await engine.reserve(
        item_id, buyer=buyer, quantity=1, idempotency_key=key, order_id=ids.next()
    )
    return answer.outcome


async def assert_sound(engine: RedisEngine, ledger: Ledger, item_id: int) -> None:
    failed = [c for c in await audit_item(engine, item_id, journal=False) if not c.ok]
    failed += [c for c in await audit_records(engine, ledger, item_id) if not c.ok]
    assert not failed, failed


@pytest.mark.redis_variants("redis7")
async def test_a_restarted_redis_fences_every_write_until_checked(
    ledger: Ledger, tmp_path: Path
) -> None:
    server = RedisServer(binary=redis7_binary(), data_dir=tmp_path / "r", appendonly=True).start()
    try:
        async with connected(server) as (redis, engine):
            item_id = await ledger.create_item(new_item(total=10, limit=2))
            await warm_item(engine, ledger, item_id)
            sale = Sale(engine, ledger, redis, item_id, ids)
            paid, held, other = [await sale.buy(b) for b in ("alice", "bob", "carol")]
            assert paid and held and other
            await pay(engine, item_id, paid, "pay-1")
            await drain(sale)
            await rewrite_aof(redis)
        server.kill()
        server.start()

        async with connected(server) as (redis, engine):
            assert await engine.fenced_items([item_id]) == [item_id]
            assert await reserve(engine, item_id, "dave") is Outcome.ITEM_RECOVERING
            # A key recorded before replays its answer: that was given already.
            replay = await engine.reserve(
                item_id, buyer="alice", quantity=1, idempotency_key="k", order_id=ids.next()
            )
            assert (replay.outcome, replay.order_id, replay.replayed) == (
                Outcome.RESERVED, paid, True
            )  # fmt: skip
            again = await pay(engine, item_id, paid, "pay-1")  # a notice answered before
            assert (again.outcome, again.replayed) == (Outcome.PAID, True)
            fresh = await pay(engine, item_id, held, "pay-2")
            assert fresh.outcome is Outcome.ITEM_RECOVERING
            cancel = await engine.release(item_id, other, ReleaseReason.CANCELLED)
            assert cancel.outcome is Outcome.ITEM_RECOVERING
            assert (await engine.terms(item_id))[1] is True  # no ticket either
            before = await engine.stock(item_id)

            [report] = await reconciler(engine, ledger).verify_fenced([item_id])

            assert report.repairs == []  # nothing was lost: checked, and it sells again
            assert await engine.fenced_items([item_id]) == []
            assert await engine.stock(item_id) == before
            assert await reserve(engine, item_id, "dave") is Outcome.RESERVED
            assert (await pay(engine, item_id, held, "pay-2")).outcome is Outcome.PAID
            await drain(Sale(engine, ledger, redis, item_id, ids))
            await assert_sound(engine, ledger, item_id)
    finally:
        server.stop()


async def evalsha_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.redis_variants("redis7")
async def test_the_fence_check_looks_at_every_item_only_when_the_server_changed(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Between restarts the reconciler's fence check asks a few commands a pass, not one per
    item; a shard a detector fences (here another engine, as the persister would) is checked
    at the next pass; after a restart every item is, and each sells again."""
    server = RedisServer(binary=redis7_binary(), data_dir=tmp_path / "r", appendonly=True).start()
    try:
        async with connected(server) as (redis, engine):
            items = [await ledger.create_item(new_item(total=5, limit=1)) for _ in range(40)]
            for item_id in items:
                await warm_item(engine, ledger, item_id)
            worker = ReconcilerWorker(
                reconciler=reconciler(engine, ledger), redis=redis, scripts=engine.scripts,
                prefix=engine.prefix, interval_s=3_600, repair=False, engine=engine,
            )  # fmt: skip
            await worker.run_once()  # every item, once: the servers were not seen yet
            before = await evalsha_calls(redis)
            for _ in range(5):
                assert await worker.run_once() == 0
            assert await evalsha_calls(redis) - before <= 10  # the upkeep lock's, not 40 a pass

            async with connected(server) as (_, detector):
                await detector.fence(items[7], 0, "behind_sql")
            assert await engine.fenced_items(items) == [items[7]]
            assert await worker.run_once() == 1
            assert await engine.fenced_items(items) == []
            await rewrite_aof(redis)
            server.kill()
            server.start()
            for _ in range(20):  # each pooled connection finds its server gone once, as a worker's
                with contextlib.suppress(RedisConnectionError):
                    await redis.ping()
                    break

            assert await engine.fenced_items(items) == items
            assert await worker.run_once() == len(items)
            assert await engine.fenced_items(items) == []
            assert await reserve(engine, items[0], "after") is Outcome.RESERVED
    finally:
        server.stop()


@pytest.mark.redis_variants("redis7")
async def test_an_older_aof_under_a_stampede_never_sells_a_unit_twice(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Demand far above stock; Redis comes back from an AOF taken earlier (a crash inside the
    fsync window) with the crowd still buying and retrying with the same keys, and the
    reconciler checking fenced items as the worker does: at most the total sold, every buyer
    within the limit, every `paid` still paid, every retried key its first order."""
    rng = random.Random(29)
    data_dir = tmp_path / "r"
    server = RedisServer(binary=redis7_binary(), data_dir=data_dir, appendonly=True).start()
    told: dict[str, tuple[int, str]] = {}  # buyer -> (order id, status) as the buyer was told
    try:
        async with connected(server) as (redis, engine):
            item_id = await ledger.create_item(new_item(total=120, limit=1))
            await warm_item(engine, ledger, item_id)
            sale = Sale(engine, ledger, redis, item_id, ids)
            await crowd(engine, item_id, range(0, 80), told, rng)
            await drain(sale)
            await rewrite_aof(redis)
        server.kill()
        copy_aof(data_dir, tmp_path / "older")  # the AOF 80 buyers in
        server.start()
        async with connected(server) as (redis, engine):
            await reconciler(engine, ledger).verify_fenced([item_id])
            sale = Sale(engine, ledger, redis, item_id, ids)
            await crowd(engine, item_id, range(80, 200), told, rng)  # SQL lands all of it
            await drain(sale)
        server.kill()
        restore_aof(tmp_path / "older", data_dir)  # the writes of 120 buyers are gone
        server.start()

        async with connected(server) as (redis, engine):
            check = reconciler(engine, ledger)
            stop = asyncio.Event()

            async def fence_checks() -> None:
                while not stop.is_set():
                    await check.verify_fenced([item_id])
                    await asyncio.sleep(0.02)

            checking = asyncio.create_task(fence_checks())
            # Every buyer tries again with the same key, and more buyers come.
            await crowd(engine, item_id, range(0, 400), told, rng, patient=True)
            stop.set()
            await checking
            sale = Sale(engine, ledger, redis, item_id, ids)
            await drain(sale)
            await assert_sound(engine, ledger, item_id)
            stock = await engine.stock(item_id)
            assert stock is not None and stock.held + stock.sold <= stock.total == 120
            holds = await engine.holds(item_id)
            per_buyer = Counter(h.buyer for h in holds.values() if h.state != "released")
            assert max(per_buyer.values()) == 1
            for buyer, (order_id, status) in told.items():
                hold = holds.get(order_id)
                assert hold is not None, f"{buyer}'s order {order_id} is gone"
                if status == "paid":
                    assert hold.state == "paid", f"{buyer} was told paid, reads {hold.state}"
    finally:
        server.stop()


async def land(sale: Sale) -> None:
    """Run a persister until its group has every entry (other groups may lag behind)."""
    persister = sale.persister()
    stream = sale.engine.keys(sale.item_id).events
    async with asyncio.timeout(30):
        while (await read_progress(sale.redis, [stream]))[0].of(GROUP).backlog:
            await persister.run_once()


@pytest.mark.redis_variants("redis7")
async def test_events_sql_landed_that_the_stream_lost_go_back_under_their_own_ids(
    ledger: Ledger, tmp_path: Path
) -> None:
    """A bridge had not read them yet when Redis went back: once rebuilt, the stream has each
    again under its own id with its own fields, so the bridge publishes each under the message
    id it would have had (and a consumer drops a copy by that id); the persister finds them
    landed and only acknowledges them."""
    data_dir = tmp_path / "r"
    server = RedisServer(binary=redis7_binary(), data_dir=data_dir, appendonly=True).start()
    try:
        async with connected(server) as (redis, engine):
            item_id = await ledger.create_item(new_item(total=20, limit=1))
            await warm_item(engine, ledger, item_id)
            stream = engine.keys(item_id).events
            await redis.xgroup_create(stream, "bridge-late", id="0")  # reads nothing: no trims
            sale = Sale(engine, ledger, redis, item_id, ids)
            assert await sale.buy("alice") and await sale.buy("bob")
            await land(sale)
            await rewrite_aof(redis)
        server.kill()
        copy_aof(data_dir, tmp_path / "older")
        server.start()
        async with connected(server) as (redis, engine):
            await reconciler(engine, ledger).verify_fenced([item_id])
            sale = Sale(engine, ledger, redis, item_id, ids)
            carol, dave = await sale.buy("carol"), await sale.buy("dave")
            assert carol and dave
            await pay(engine, item_id, carol, "pay-carol")
            await engine.release(item_id, dave, ReleaseReason.CANCELLED)
            await pay(engine, item_id, dave, "pay-dave")  # too late: a refund owed
            await land(sale)
            before = dict(await redis.xrange(stream))
        server.kill()
        restore_aof(tmp_path / "older", data_dir)
        server.start()

        async with connected(server) as (redis, engine):
            survived = dict(await redis.xrange(stream))
            lost = {i: f for i, f in before.items() if i not in survived and f["event"] != "loaded"}
            kinds = Counter(f["event"] for f in lost.values())
            assert kinds == {"reserved": 2, "paid": 1, "released": 1, "refund_required": 1}

            await reconciler(engine, ledger).verify_fenced([item_id])

            after = dict(await redis.xrange(stream))
            assert {i: after.get(i) for i in lost} == lost
            sale = Sale(engine, ledger, redis, item_id, ids)
            await land(sale)
            await assert_sound(engine, ledger, item_id)
            assert await ledger.journal_size(item_id) == len(after)  # each landed once
    finally:
        server.stop()


async def crowd(
    engine: RedisEngine,
    item_id: int,
    buyers: range,
    told: dict[str, tuple[int, str]],
    rng: random.Random,
    *,
    patient: bool = False,
) -> None:
    """Each buyer buys with its own key (told 202: remembered), and most of those who hold pay.
    ``patient``: a buyer answered 503 item_recovering tries again until it is answered."""

    async def one(n: int) -> None:
        buyer = f"b{n}"
        while True:
            answer = await engine.reserve(
                item_id, buyer=buyer, quantity=1, idempotency_key=f"key-{buyer}",
                order_id=ids.next(),
            )  # fmt: skip
            if answer.outcome is not Outcome.ITEM_RECOVERING or not patient:
                break
            await asyncio.sleep(0.01)
        if answer.order_id is None:
            return
        if buyer in told:  # a retry: the order it was told before, never a second one
            assert answer.order_id == told[buyer][0], (buyer, answer, told[buyer])
            return
        told[buyer] = (answer.order_id, "held")
        if rng.random() < 0.7:
            paid = await pay(engine, item_id, answer.order_id)
            if paid.outcome is Outcome.PAID:
                told[buyer] = (answer.order_id, "paid")

    await asyncio.gather(*(one(n) for n in buyers))


@pytest.mark.parametrize("lost", ["one shard", "two shards", "every shard"])
async def test_an_item_over_shards_is_rebuilt_whichever_shards_were_lost(
    engine: RedisEngine, ledger: Ledger, redis: Redis, lost: str
) -> None:
    """Four shards, transfers between them, orders paid and released; then the keys of one,
    two or all four shards are gone. The reconciler finds it, fences the item and rebuilds it
    whole: every order where SQL has it, every key replays, the shards add up to the total and
    the sale sells out exactly."""
    item_id = await ledger.create_item(
        dataclasses.replace(new_item(total=60, limit=2), stock_shards=4)
    )
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, ids)
    rng = random.Random(len(lost))
    orders = {}
    for n in range(30):
        order_id = await sale.buy(f"b{n}", rng.choice((1, 2)))
        if order_id:
            orders[f"b{n}"] = order_id
            fate = rng.random()
            if fate < 0.5:
                await pay(engine, item_id, order_id)
            elif fate < 0.7:
                await engine.release(item_id, order_id, ReleaseReason.CANCELLED)
    await drain(sale)
    holds = await engine.holds(item_id)
    gone = {"one shard": [2], "two shards": [0, 3], "every shard": [0, 1, 2, 3]}[lost]
    for shard in gone:
        keys = engine.keys(item_id, shard)
        names = [k async for k in redis.scan_iter(match=keys.item + "*")]
        await redis.delete(*names)

    report = await reconciler(engine, ledger).reconcile(item_id)

    assert {f.kind for f in report.found} & {Drift.ORDER_MISSING_IN_REDIS, Drift.REDIS_LOST_ITEM}
    assert await engine.fenced_items([item_id]) in ([item_id], [])  # fenced, or rebuilt whole
    await reconciler(engine, ledger).verify_fenced([item_id])
    assert await engine.fenced_items([item_id]) == []
    assert await engine.holds(item_id) == holds  # every order back, where it was
    for buyer, order_id in orders.items():  # every key replays its order
        again = await engine.reserve(
            item_id, buyer=buyer, quantity=1, idempotency_key="k", order_id=ids.next()
        )
        assert again.order_id == order_id and again.replayed, (buyer, again)
    await drain(sale)
    await assert_sound(engine, ledger, item_id)
    answers = await asyncio.gather(*(sale.buy(f"late-{n}") for n in range(60)))
    await drain(sale)
    await assert_sound(engine, ledger, item_id)
    stock = await engine.stock(item_id)
    assert stock is not None and stock.available == 0 and stock.held + stock.sold == 60
    assert sum(1 for a in answers if a) > 0


@pytest.mark.redis_variants("redis7", "cluster")
@pytest.mark.parametrize("lost", ["the receipt", "the sending"])
async def test_a_shard_that_lost_its_half_of_a_transfer_is_rebuilt_and_sells_each_unit_once(
    engine: RedisEngine, ledger: Ledger, redis: Redis, lost: str
) -> None:
    """A unit moves from shard 1 to shard 0, then one of the two is back as it was before (its
    keys restored and fenced, as a restart from an older AOF leaves it) while the other, on
    another server, keeps its half. The receipt lost, the unit is on no shard and nothing
    delivers it again; the sending lost, it is on both. Neither landed in SQL, so SQL agrees
    with the shard that went back: the fence check finds the transfer lost and rebuilds the
    item, which then sells exactly its total."""
    item_id = await ledger.create_item(
        dataclasses.replace(new_item(total=8, limit=1), stock_shards=4)
    )
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, ids)
    await drain(sale)
    source, receiver = 1, 0
    rewound = engine.keys(item_id, receiver if lost == "the receipt" else source)
    names = [k async for k in redis.scan_iter(match=rewound.item + "*")]
    before = {name: await redis.dump(name) for name in names}
    moved = await engine.transfer(item_id, source=source, to=receiver, need=1, transfer_id="t-1")
    assert moved == 1
    for name in [k async for k in redis.scan_iter(match=rewound.item + "*")]:
        await redis.delete(name)
    for name, dumped in before.items():
        await redis.restore(name, 0, dumped)
    await engine.fence(item_id, rewound.shard, "restarted")
    await drain(sale)  # the other half lands; SQL never had the lost one

    [report] = await reconciler(engine, ledger).verify_fenced([item_id])

    assert Drift.TRANSFER_LOST in {f.kind for f in report.found}, report.found
    assert await engine.fenced_items([item_id]) == []
    answers = [await sale.buy(f"b{n}") for n in range(20)]
    await drain(sale)
    assert sum(1 for answer in answers if answer) == 8
    stock = await engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held) == (0, 8), stock
    await assert_sound(engine, ledger, item_id)


async def test_a_persister_that_finds_redis_behind_sql_fences_the_item(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    """Redis sells a unit SQL counts sold already (its counters went back): landing it would
    take SQL's stock below zero, with no earlier entry pending to explain it. The persister
    fences the shard at once: nothing more is sold on it until it is rebuilt."""
    item_id = await ledger.create_item(new_item(total=2, limit=1))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, ids)
    assert await sale.buy("alice") and await sale.buy("bob")
    await drain(sale)
    await redis.hset(engine.keys(item_id).item, mapping={"available": 2, "held": 0})
    assert await sale.buy("carol")  # sold on what Redis no longer counts
    persister = Persister(
        redis=redis, ledger=ledger, engine=engine,
        config=PersisterConfig(block_ms=10, max_deliveries=1, claim_idle_ms=50),
        prefix=DEFAULT_PREFIX,
    )  # fmt: skip
    for _ in range(5):
        await persister.run_once()

    assert await engine.fenced_items([item_id]) == [item_id]
    assert await reserve(engine, item_id, "dave") is Outcome.ITEM_RECOVERING
    assert persister.dead_lettered == 1  # the entry itself is a person's to look at
