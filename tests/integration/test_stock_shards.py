"""One item's stock over several shards: never oversold, never undersold, limits and keys exact.

The undersell bound these tests hold the engine to: a buyer under the limit is refused
``sold_out`` only after every other shard answered, within the same request, that it had
nothing left (a short home shard asks them all, fullest first); so a sale whose demand exceeds
its stock ends with nothing available on any shard, and a unit released later is sold again to
the next buyer who asks, whichever shard it returned to. Units in transit between two shards
(one round trip, or one reaper pass after ``TRANSIT_GRACE_MS`` if the sender stopped) are the
one exception, and they are never lost.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from seckill.domain.events import ReleaseReason
from seckill.domain.ids import OrderIds
from seckill.domain.items import Stock
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.shards import home_shard, split_stock
from seckill.engine.audit import audit_item
from seckill.engine.engine import TRANSIT_GRACE_MS, RedisEngine
from seckill.engine.scripts import ScriptName
from seckill.workers.reaper import Reaper
from tests.conftest import FREE, ManualClock, open_item, pay

pytestmark = pytest.mark.redis_variants("redis7", "cluster")


async def shard_available(engine: RedisEngine, item_id: int = 1) -> list[int]:
    counts = []
    for shard in range(await engine.shard_count(item_id)):
        part = await engine.shard_stock(item_id, shard)
        assert part is not None
        counts.append(part[0].available)
    return counts


async def assert_audit_passes(engine: RedisEngine, item_id: int = 1) -> None:
    failed = [f"{c.name}: {c.detail}" for c in await audit_item(engine, item_id) if not c.ok]
    assert not failed


def buyers_homed_on(shard: int, shards: int, count: int) -> list[str]:
    """``count`` buyer ids whose home is ``shard``."""
    found, n = [], 0
    while len(found) < count:
        buyer = f"buyer-{n}"
        if home_shard(buyer, shards) == shard:
            found.append(buyer)
        n += 1
    return found


async def stampede(
    engine: RedisEngine, buyers: list[str], *, quantity: int = 1
) -> Counter[Outcome]:
    ids = OrderIds(3)
    start = asyncio.Event()
    # As many in flight as an API's connections allow: the cluster client opens one connection
    # per command in flight, and thousands at once would exhaust the servers' descriptors.
    in_flight = asyncio.Semaphore(128)

    async def buy(buyer: str) -> Outcome:
        await start.wait()
        async with in_flight:
            reservation = await engine.reserve(
                1, buyer=buyer, quantity=quantity, idempotency_key="k", order_id=ids.next()
            )
        return reservation.outcome

    tasks = [asyncio.create_task(buy(b)) for b in buyers]
    start.set()
    return Counter(await asyncio.gather(*tasks))


async def test_load_splits_the_stock_and_fixes_shards_and_total(engine: RedisEngine) -> None:
    item = open_item(total=10, stock_shards=4)
    assert await engine.load_item(item) is Outcome.LOADED
    assert await shard_available(engine) == split_stock(10, 4) == [3, 3, 2, 2]
    assert await engine.item(1) == item
    assert await engine.stock(1) == Stock(10, 10, 0, 0)
    # Loaded again (a restart warming it): the shards keep what they hold.
    assert await engine.load_item(item) is Outcome.LOADED
    assert await shard_available(engine) == [3, 3, 2, 2]
    for changed in (open_item(total=11, stock_shards=4), open_item(total=10, stock_shards=2)):
        with pytest.raises(InvalidRequest) as refused:
            await engine.load_item(changed)
        assert refused.value.code is ErrorCode.STOCK_SHARDS_FIXED
    assert await shard_available(engine) == [3, 3, 2, 2]


async def test_1000_buyers_for_100_units_over_8_shards(engine: RedisEngine) -> None:
    # Ten buyers a unit, some 125 homed on each shard of 12 or 13 units: every shard sells out
    # under its own crowd while others still sell, and the last units race. 5,000 buyers only
    # added sold-out answers after the last unit went.
    await engine.load_item(open_item(total=100, stock_shards=8))
    outcomes = await stampede(engine, [f"buyer-{n}" for n in range(1_000)])
    assert outcomes[Outcome.RESERVED] == 100
    assert set(outcomes) == {Outcome.RESERVED, Outcome.SOLD_OUT}
    assert await shard_available(engine) == [0] * 8  # none left anywhere: no undersell
    assert await engine.stock(1) == Stock(100, 0, 100, 0)
    await assert_audit_passes(engine)


async def test_demand_equal_to_supply_sells_every_unit(engine: RedisEngine) -> None:
    """Each of 150 buyers may take 2 and asks for 2: exactly the 300 units there are."""
    await engine.load_item(open_item(total=300, limit=2, stock_shards=8))
    outcomes = await stampede(engine, [f"b{n}" for n in range(150)], quantity=2)
    assert outcomes == Counter({Outcome.RESERVED: 150})
    assert await shard_available(engine) == [0] * 8
    await assert_audit_passes(engine)


async def test_the_last_unit_of_every_shard_is_sold(engine: RedisEngine) -> None:
    """One unit per shard, and every buyer lives on shard 0: each unit still sells, one by
    one, and the next buyer hears sold out."""
    await engine.load_item(open_item(total=6, stock_shards=6))
    buyers = buyers_homed_on(0, 6, 7)
    answers = [
        (await engine.reserve(1, buyer=b, quantity=1, idempotency_key="k", order_id=n)).outcome
        for n, b in enumerate(buyers, start=1)
    ]
    assert answers == [Outcome.RESERVED] * 6 + [Outcome.SOLD_OUT]
    assert await shard_available(engine) == [0] * 6
    await assert_audit_passes(engine)


async def test_units_on_a_fenced_shard_are_not_sold_out(engine: RedisEngine) -> None:
    """A buyer whose home shard is empty, while the unit left is on a fenced shard, hears
    item_recovering (ask again), not sold_out: the fenced shard could not say it had none, and
    a sold_out would arm the process's flag against a unit that is there."""
    await engine.load_item(open_item(total=2, stock_shards=2))  # one unit on each shard
    first, second = buyers_homed_on(0, 2, 2)
    bought = await engine.reserve(1, buyer=first, quantity=1, idempotency_key="k", order_id=1)
    assert bought.outcome is Outcome.RESERVED  # shard 0's unit
    assert await engine.fence(1, 1, "test") is Outcome.FENCED
    answer = await engine.reserve(1, buyer=second, quantity=1, idempotency_key="k", order_id=2)
    assert answer.outcome is Outcome.ITEM_RECOVERING
    assert await shard_available(engine) == [0, 1]  # the unit stays for when it is verified


async def test_units_released_on_empty_shards_are_sold_again(engine: RedisEngine) -> None:
    """Sold out, then buyers of shard 0 cancel: their units return to shard 0, and buyers whose
    home is shard 1 (empty) buy every one of them."""
    await engine.load_item(open_item(total=40, stock_shards=4))
    first = buyers_homed_on(0, 4, 40)
    for n, buyer in enumerate(first, start=1):
        got = await engine.reserve(1, buyer=buyer, quantity=1, idempotency_key="k", order_id=n)
        assert got.outcome is Outcome.RESERVED
    assert await shard_available(engine) == [0, 0, 0, 0]
    for order_id in range(1, 11):
        assert (await engine.release(1, order_id, ReleaseReason.CANCELLED)).outcome is (
            Outcome.RELEASED
        )
    assert await shard_available(engine) == [10, 0, 0, 0]
    outcomes = await stampede(engine, buyers_homed_on(1, 4, 30))
    assert outcomes == Counter({Outcome.RESERVED: 10, Outcome.SOLD_OUT: 20})
    assert await shard_available(engine) == [0, 0, 0, 0]
    await assert_audit_passes(engine)


async def test_one_buyer_with_50_keys_in_parallel_stays_within_the_limit(
    engine: RedisEngine,
) -> None:
    await engine.load_item(open_item(total=1_000, limit=3, stock_shards=4))
    ids = OrderIds(4)
    replies = await asyncio.gather(
        *(
            engine.reserve(1, buyer="eve", quantity=1, idempotency_key=f"k{n}", order_id=ids.next())
            for n in range(50)
        )
    )
    outcomes = Counter(r.outcome for r in replies)
    assert outcomes == Counter({Outcome.RESERVED: 3, Outcome.LIMIT_REACHED: 47})
    assert await engine.buyer_units(1) == {"eve": 3}
    await assert_audit_passes(engine)


async def test_a_key_has_one_effect_across_shards(engine: RedisEngine) -> None:
    """A repeat is answered from the buyer's home shard, also once a transfer fed it."""
    await engine.load_item(open_item(total=4, limit=2, stock_shards=4))
    buyer = buyers_homed_on(2, 4, 1)[0]
    first = await engine.reserve(1, buyer=buyer, quantity=2, idempotency_key="k", order_id=7)
    assert first.outcome is Outcome.RESERVED  # one unit at home: the other came by transfer
    again = await engine.reserve(1, buyer=buyer, quantity=2, idempotency_key="k", order_id=8)
    assert again.order_id == 7 and again.replayed
    assert await engine.recorded(1, buyer=buyer, quantity=2, idempotency_key="k") == again
    assert await engine.stock(1) == Stock(4, 2, 2, 0)
    await assert_audit_passes(engine)


async def test_orders_are_paid_cancelled_and_expired_on_their_shard(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    engine = timed_engine
    await engine.load_item(open_item(total=9, stock_shards=3, hold_ms=1_000))
    clock.now_ms = int(clock.now_ms)
    buyers = [buyers_homed_on(shard, 3, 1)[0] for shard in range(3)]
    for order_id, buyer in enumerate(buyers, start=1):
        await engine.reserve(1, buyer=buyer, quantity=1, idempotency_key="k", order_id=order_id)
    assert [await engine.order_shard(1, order_id) for order_id in (1, 2, 3)] == [0, 1, 2]
    assert (await pay(engine, 1, 1)).outcome is Outcome.PAID
    settled = await engine.settle_payment(
        1, 2, payment_id="p-1", succeeded=False, charged=FREE, unit_price=FREE
    )
    assert settled.outcome is Outcome.RELEASED
    # The same payment id for another order, on another shard: still recognised as reused.
    with pytest.raises(InvalidRequest) as reused:
        await engine.settle_payment(
            1, 3, payment_id="p-1", succeeded=True, charged=FREE, unit_price=FREE
        )
    assert reused.value.code is ErrorCode.PAYMENT_ID_REUSED
    clock.advance(1_000)
    assert await engine.expire_due(1, shard=2) == [3]
    assert await engine.stock(1) == Stock(9, 8, 0, 1)
    await assert_audit_passes(engine)


async def test_a_transfer_left_in_transit_is_counted_and_then_delivered(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    """The first half of a transfer with no second (its sender stopped): the units count as
    available while in transit, and the reaper delivers them once the grace is over."""
    engine = timed_engine
    await engine.load_item(open_item(total=8, stock_shards=2))
    keys = engine.keys(1, 0)
    reply = await engine.scripts.call(
        ScriptName.TRANSFER_OUT,
        (*keys.all_fixed(), keys.transfers, keys.in_transit),
        (1, "t-1", 1, 2, clock()),
    )
    assert reply == [Outcome.TRANSFERRED.value, 2]
    assert await shard_available(engine) == [2, 4]  # 2 in transit
    assert await engine.stock(1) == Stock(8, 8, 0, 0)
    await assert_audit_passes(engine)

    assert await Reaper(engine=engine).run_once() == 0
    assert await shard_available(engine) == [2, 4]  # within the grace: its sender may go on
    clock.advance(TRANSIT_GRACE_MS + 1)
    await Reaper(engine=engine).run_once()
    assert await shard_available(engine) == [2, 6]
    assert await engine.stock(1) == Stock(8, 8, 0, 0)
    # Delivered twice (the sender woke up after all): received once.
    await engine.transfer(1, source=0, to=1, need=2, transfer_id="t-1")
    assert await shard_available(engine) == [2, 6]
    await assert_audit_passes(engine)
