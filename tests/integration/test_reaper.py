"""The reaper: every hold past its deadline is released once, whatever the number of reapers."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from redis.asyncio import Redis

from seckill.domain.events import ReleaseReason
from seckill.domain.holds import HoldState
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from seckill.workers.reaper import Reaper
from tests.conftest import ManualClock, open_item

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")


async def hold_many(
    engine: RedisEngine, item_id: int, count: int, ids: OrderIds, buyers: str = "b"
) -> list[int]:
    answers = await asyncio.gather(
        *(
            engine.reserve(
                item_id, buyer=f"{buyers}{n}", quantity=1, idempotency_key="k", order_id=ids.next()
            )
            for n in range(count)
        )
    )
    assert all(a.accepted for a in answers)
    return [a.order_id for a in answers if a.order_id]


async def test_only_holds_past_their_deadline_are_released(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    ids = OrderIds(1)
    await timed_engine.load_item(open_item(1, total=50, hold_ms=10_000))
    early = await hold_many(timed_engine, 1, 10, ids)
    clock.advance(5_000)
    late = await hold_many(timed_engine, 1, 10, ids, buyers="late")
    reaper = Reaper(engine=timed_engine, batch=3)  # several batches per pass

    assert await reaper.run_once() == 0
    clock.advance(5_000)  # the first ten are due, exactly at their deadline
    assert await reaper.run_once() == 10
    holds = await timed_engine.holds(1)
    assert {holds[o].state for o in early} == {HoldState.RELEASED}
    assert {holds[o].reason for o in early} == {ReleaseReason.EXPIRED}
    assert {holds[o].state for o in late} == {HoldState.HELD}
    assert await reaper.run_once() == 0


async def test_every_item_is_reaped(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    ids = OrderIds(1)
    for item_id in (1, 2, 3):
        await timed_engine.load_item(open_item(item_id, total=5, hold_ms=1_000))
        await hold_many(timed_engine, item_id, 5, ids)
    clock.advance(1_000)
    assert await Reaper(engine=timed_engine).run_once() == 15
    for item_id in (1, 2, 3):
        stock = await timed_engine.stock(item_id)
        assert stock is not None and (stock.available, stock.held) == (5, 0)


async def test_reapers_side_by_side_release_each_hold_once(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    ids = OrderIds(1)
    await timed_engine.load_item(open_item(1, total=2_000, hold_ms=1_000))
    await hold_many(timed_engine, 1, 2_000, ids)
    clock.advance(1_000)
    reapers = [Reaper(engine=timed_engine, batch=50) for _ in range(4)]
    released = await asyncio.gather(*(r.run_once() for r in reapers))
    assert sum(released) == 2_000  # shared, never doubled
    kinds = Counter(fields["event"] for _, fields in await timed_engine.events(1))
    assert kinds["released"] == 2_000
    failed = [c for c in await audit_item(timed_engine, 1) if not c.ok]
    assert not failed, failed


async def test_a_pass_looks_only_at_items_that_changed_or_fall_due(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    """Idle items are not read again pass after pass: the work follows what changed."""
    for item_id in range(1, 21):
        await timed_engine.load_item(open_item(item_id, total=5, hold_ms=10_000))
    reaper = Reaper(engine=timed_engine)
    assert await reaper.run_once() == 0
    assert reaper.looked == 20  # each new to it
    clock.advance(1_000)
    assert await reaper.run_once() == 0
    assert reaper.looked == 20  # nothing changed, nothing due
    await hold_many(timed_engine, 7, 1, OrderIds(1))
    assert await reaper.run_once() == 0
    assert reaper.looked == 21  # the item whose stream moved


async def test_a_hold_made_after_the_last_look_is_released_at_its_deadline(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(1, total=5, hold_ms=10_000))
    reaper = Reaper(engine=timed_engine)
    assert await reaper.run_once() == 0  # looked: no hold, next look in 10 s at the latest
    clock.advance(4_000)
    [order_id] = await hold_many(timed_engine, 1, 1, OrderIds(1))  # due 4 s after that look
    assert await reaper.run_once() == 0
    clock.advance(9_999)
    assert await reaper.run_once() == 0
    clock.advance(1)  # at its deadline: released by this pass
    assert await reaper.run_once() == 1
    hold = await timed_engine.hold(1, order_id)
    assert hold is not None and hold.state is HoldState.RELEASED


async def test_an_item_reloaded_with_a_shorter_hold_is_reaped_on_time(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(1, total=5, hold_ms=60_000))
    reaper = Reaper(engine=timed_engine, revisit_s=3_600)  # no revisit to rescue it
    assert await reaper.run_once() == 0  # looked: next look in 60 s at the latest
    assert await timed_engine.load_item(open_item(1, total=5, hold_ms=1_000)) is Outcome.LOADED
    await hold_many(timed_engine, 1, 2, OrderIds(1))
    clock.advance(1_000)
    assert await reaper.run_once() == 2


async def test_an_item_loaded_between_passes_is_reaped(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(1, total=5, hold_ms=60_000))
    reaper = Reaper(engine=timed_engine, revisit_s=3_600)
    assert await reaper.run_once() == 0
    await timed_engine.load_item(open_item(2, total=5, hold_ms=500))
    await hold_many(timed_engine, 2, 3, OrderIds(1))
    clock.advance(500)
    assert await reaper.run_once() == 3


async def test_a_deadline_no_script_announced_is_found_within_the_revisit_bound(
    timed_engine: RedisEngine, redis: Redis, clock: ManualClock
) -> None:
    """A hold whose deadline moved earlier behind the scripts' back (a hand edit, a restored
    file): no stream entry tells of it, so the revisit bound is what finds it."""
    await timed_engine.load_item(open_item(1, total=5, hold_ms=60_000))
    [order_id] = await hold_many(timed_engine, 1, 1, OrderIds(1))
    reaper = Reaper(engine=timed_engine, revisit_s=5)
    assert await reaper.run_once() == 0  # looked: due in 60 s
    await redis.zadd(timed_engine.keys(1).deadlines, {str(order_id): clock() - 1})
    assert await reaper.run_once() == 0  # not looked at: nothing said it changed
    clock.advance(5_000)
    assert await reaper.run_once() == 1
