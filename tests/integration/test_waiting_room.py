"""The waiting room in Redis: unique contiguous positions, a random draw for those who came
before the start and first come first served after, an inlet that keeps its pace and its stock
cap, and a front that tells the truth once the item is sold out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

from seckill.crowd.fairness import rank_correlation, unrelated_bound
from seckill.domain.items import SaleItem
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.queue import QueueState, standing
from seckill.engine.engine import RedisEngine
from seckill.engine.queues import DRAW_BELOW, Joined, Queues
from seckill.workers.inlet import Inlet
from seckill.workers.loop import run_until_stopped
from tests.conftest import ManualClock, RedisTarget, open_item, pay
from tests.support.polling import wait_until

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

LEAD_MS = 600_000
TURN_MS = 60_000


def upcoming_item(clock: ManualClock, *, total: int = 100, starts_in_ms: int = 60_000) -> SaleItem:
    return SaleItem(
        item_id=1,
        total=total,
        starts_at_ms=clock.now_ms + starts_in_ms,
        ends_at_ms=clock.now_ms + 3_600_000,
        per_buyer_limit=1,
        hold_ms=60_000,
        waiting_room=True,
    )


async def join_all(queues: Queues, buyers: list[str]) -> list[int]:
    joined = await asyncio.gather(*(queues.join(1, b, lead_ms=LEAD_MS) for b in buyers))
    assert {j.outcome for j in joined} == {Outcome.QUEUED}
    return [j.position for j in joined]


async def test_concurrent_joins_get_unique_contiguous_positions(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=10, waiting_room=True))
    queues = Queues(engine)
    # 1,000 joins at once: on one Redis they queue for all 32 connections of the client's pool
    # throughout; on a cluster (whose client opens a connection per call in flight) they race
    # over hundreds. 5,000 raced no harder, and opening them took 10 s on the cluster.
    buyers = [f"b{i}" for i in range(1000)]
    positions = await join_all(queues, buyers)
    assert sorted(positions) == list(range(1, 1001))
    again = await queues.join(1, "b17", lead_ms=LEAD_MS)
    assert again == type(again)(Outcome.ALREADY_QUEUED, positions[17])
    front = await queues.front(1)
    assert front is not None and front.length == 1000 and front.sealed


async def test_pre_start_joiners_are_drawn_in_random_order(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(upcoming_item(clock))
    seeded = random.Random(7)
    queues = Queues(timed_engine, draw=lambda: seeded.randrange(DRAW_BELOW))
    early = [f"early{i}" for i in range(400)]
    for buyer in early:  # one at a time: arrival order is the list's
        assert (await queues.join(1, buyer, lead_ms=LEAD_MS)).position == 0
        clock.advance(1)
    placed = await queues.place(1, "early0")
    assert placed.outcome is Outcome.PLACED and placed.position == 0  # not drawn yet

    clock.advance(60_000)  # the sale starts: the first script to run seals the draw
    late = await queues.join(1, "late0", lead_ms=LEAD_MS)
    assert late.position == 401
    drawn = [(await queues.place(1, b)).position for b in early]
    assert sorted(drawn) == list(range(1, 401))
    rho = rank_correlation(range(400), drawn)
    assert abs(rho) < unrelated_bound(400), rho  # for a fair draw, 1 seed in 15,000 fails
    assert (await queues.join(1, "early5", lead_ms=LEAD_MS)).position == drawn[5]


async def test_after_the_start_it_is_first_come_first_served(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(upcoming_item(clock, starts_in_ms=-1))
    queues = Queues(timed_engine)
    positions = [(await queues.join(1, f"b{i}", lead_ms=LEAD_MS)).position for i in range(50)]
    assert positions == list(range(1, 51))


async def test_the_queue_opens_at_its_lead_and_closes_with_the_sale(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    item = upcoming_item(clock, starts_in_ms=LEAD_MS + 5_000)
    await timed_engine.load_item(item)
    queues = Queues(timed_engine)
    early = await queues.join(1, "alice", lead_ms=LEAD_MS)
    assert early == type(early)(Outcome.NOT_STARTED, opens_at_ms=item.starts_at_ms - LEAD_MS)
    assert await queues.queued_items() == []
    clock.advance(5_000)
    assert (await queues.join(1, "alice", lead_ms=LEAD_MS)).outcome is Outcome.QUEUED
    assert await queues.queued_items() == [1]
    clock.now_ms = item.ends_at_ms
    assert (await queues.join(1, "bob", lead_ms=LEAD_MS)).outcome is Outcome.ENDED
    assert (await queues.join(1, "x", lead_ms=LEAD_MS)).outcome is Outcome.ENDED
    assert (await Queues(timed_engine).join(2, "x", lead_ms=LEAD_MS)).outcome is (
        Outcome.UNKNOWN_ITEM
    )


async def test_an_item_without_a_waiting_room_has_no_queue_to_join(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=10))
    queues = Queues(engine)
    assert await queues.join(1, "alice", lead_ms=LEAD_MS) == Joined(Outcome.NOT_QUEUED)
    assert await queues.queued_items() == []
    front = await queues.front(1)
    assert front is not None and front.length == 0


async def test_an_item_opens_its_queue_at_its_own_lead(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    own = replace(upcoming_item(clock, starts_in_ms=20_000), queue_open_seconds=10)
    await timed_engine.load_item(own)
    queues = Queues(timed_engine)
    early = await queues.join(1, "alice", lead_ms=LEAD_MS)  # the deployment's would let her in
    assert early == Joined(Outcome.NOT_STARTED, opens_at_ms=own.starts_at_ms - 10_000)
    clock.advance(10_000)
    assert (await queues.join(1, "alice", lead_ms=LEAD_MS)).outcome is Outcome.QUEUED
    # Loaded again without its own lead: the deployment's.
    await timed_engine.load_item(replace(own, queue_open_seconds=None))
    assert (await queues.join(1, "bob", lead_ms=LEAD_MS)).outcome is Outcome.QUEUED


async def test_the_inlet_keeps_the_items_own_rate(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    paced = replace(open_item(total=10_000, waiting_room=True), queue_admit_per_second=20)
    other = replace(paced, item_id=2, queue_admit_per_second=None)
    await timed_engine.load_item(paced)
    await timed_engine.load_item(other)
    queues = Queues(timed_engine)
    for item_id in (1, 2):
        joined = [queues.join(item_id, f"b{i}", lead_ms=LEAD_MS) for i in range(500)]
        assert {j.outcome for j in await asyncio.gather(*joined)} == {Outcome.QUEUED}
    frontiers: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(10):  # one second in steps of 100 ms, the deployment's rate 100 a second
        for item_id, frontier in frontiers.items():
            step = await queues.advance(item_id, rate=100, per_unit=0, turn_ms=TURN_MS)
            frontier.append(step.admitted_up_to)
        clock.advance(100)
    assert all(b - a == 2 for a, b in pairwise(frontiers[1][1:])), frontiers[1]
    assert all(b - a == 10 for a, b in pairwise(frontiers[2][1:])), frontiers[2]


async def test_a_head_rebuilt_from_nothing_keeps_the_items_room(engine: RedisEngine) -> None:
    item = replace(open_item(waiting_room=True), queue_admit_per_second=3, queue_open_seconds=5)
    await engine.recover(item, last_landed_id="0-0", orders=[])  # Redis lost everything
    loaded, fenced = await engine.terms(1)
    assert loaded is not None and loaded.waiting_room and not fenced
    head = await engine.execute(
        "HMGET", engine.keys(1).item, "queue_admit_per_second", "queue_open_ms"
    )
    assert head == ["3", "5000"]
    assert (await Queues(engine).join(1, "alice", lead_ms=LEAD_MS)).outcome is Outcome.QUEUED


async def test_bad_input_is_refused_and_changes_nothing(engine: RedisEngine) -> None:
    await engine.load_item(open_item(waiting_room=True))
    queues = Queues(engine)
    with pytest.raises(InvalidRequest) as refused:
        await queues.join(1, "has space", lead_ms=LEAD_MS)
    assert refused.value.code is ErrorCode.INVALID_BUYER
    with pytest.raises(InvalidRequest) as refused:
        await queues.advance(1, rate=-1, per_unit=0, turn_ms=TURN_MS)
    assert refused.value.code is ErrorCode.INVALID_ADMISSION
    front = await queues.front(1)
    assert front is not None and front.length == 0 and front.admitted_up_to == 0


async def test_the_inlet_keeps_its_rate(timed_engine: RedisEngine, clock: ManualClock) -> None:
    await timed_engine.load_item(open_item(total=10_000, waiting_room=True))
    queues = Queues(timed_engine)
    await join_all(queues, [f"b{i}" for i in range(1000)])
    frontier = []
    for _ in range(20):  # two seconds in steps of 100 ms at 50 a second
        step = await queues.advance(1, rate=50, per_unit=0, turn_ms=TURN_MS)
        frontier.append(step.admitted_up_to)
        clock.advance(100)
    # At most a second's worth at once (the credit's cap), then 5 per step.
    assert frontier[0] <= 50
    assert all(b - a == 5 for a, b in pairwise(frontier[1:])), frontier
    assert frontier == sorted(frontier)
    admissions = await queues.admissions(1)
    assert [a.upto for a in admissions] == sorted(set(frontier))
    front = await queues.front(1)
    assert front is not None and front.admissions_per_s == pytest.approx(50, rel=0.1)


async def test_the_stock_caps_admission_until_a_turn_passes(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=10, waiting_room=True))
    queues = Queues(timed_engine)
    await join_all(queues, [f"b{i}" for i in range(100)])
    step = await queues.advance(1, rate=0, per_unit=2, turn_ms=TURN_MS)
    assert step.admitted_up_to == 20  # 2 per unit available
    clock.advance(1_000)
    assert (await queues.advance(1, rate=0, per_unit=2, turn_ms=TURN_MS)).moved == 0
    # Nobody bought: after a turn the 20 age out of the cap and the next 20 are let in.
    clock.advance(TURN_MS)
    assert (await queues.advance(1, rate=0, per_unit=2, turn_ms=TURN_MS)).admitted_up_to == 40


async def test_sold_out_ends_every_wait_and_returned_units_resume_it(
    timed_engine: RedisEngine, clock: ManualClock
) -> None:
    await timed_engine.load_item(open_item(total=1, waiting_room=True))
    queues = Queues(timed_engine)
    await join_all(queues, ["b1", "b2", "b3"])
    await queues.advance(1, rate=0, per_unit=1, turn_ms=TURN_MS)
    held = await timed_engine.reserve(1, buyer="b1", quantity=1, order_id=7, idempotency_key="k")
    assert held.outcome is Outcome.RESERVED
    front = await queues.front(1)
    assert front is not None and not front.sold_out  # a hold may come back
    assert standing(3, front, clock.now_ms).state is QueueState.WAITING

    await pay(timed_engine, 1, 7)
    front = await queues.front(1)
    assert front is not None and front.sold_out
    assert {standing(p, front, clock.now_ms).state for p in (1, 2, 3)} == {QueueState.SOLD_OUT}


async def test_the_inlet_worker_lets_buyers_in_at_its_rate(engine: RedisEngine) -> None:
    """In real time, on Redis's clock: one second's burst at most, then the rate."""
    await engine.load_item(open_item(total=10_000, waiting_room=True))
    queues = Queues(engine)
    await join_all(queues, [f"b{i}" for i in range(1000)])
    inlet = Inlet(
        queues=queues, redis=engine.redis, scripts=engine.scripts, prefix=engine.prefix,
        interval_s=0.05, rate=40, per_unit=0, turn_ms=TURN_MS,
    )  # fmt: skip
    stop = asyncio.Event()
    started = time.monotonic()
    running = asyncio.create_task(run_until_stopped(inlet, stop, idle_pause=0.05))
    await asyncio.sleep(2)
    stop.set()
    await running
    elapsed = time.monotonic() - started
    front = await queues.front(1)
    assert front is not None
    # The first step's credit is one second's worth (40), then 40 a second.
    assert 40 + 40 * (elapsed - 1.0) <= front.admitted_up_to <= 40 + 40 * elapsed + 1, (
        front.admitted_up_to,
        elapsed,
    )
    assert inlet.admitted == front.admitted_up_to


@contextlib.contextmanager
def inlet_process(redis_url: str, data_dir: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``seckill worker inlet`` at 50 a second, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")} | {
        "SECKILL_REDIS_URL": redis_url,
        "SECKILL_DATA_DIR": str(data_dir),
        "SECKILL_QUEUE_ADMIT_PER_SECOND": "50",
        "SECKILL_QUEUE_ADMIT_PER_UNIT": "0",
    }
    argv = [sys.executable, "-m", "seckill.cli", "worker", "inlet", "--interval", "0.05"]
    with log.open("wb") as out:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=out)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


@pytest.mark.redis_variants("redis7")
async def test_a_killed_inlet_is_replaced_and_the_rate_holds(
    engine: RedisEngine, redis_server: RedisTarget, tmp_path: Path
) -> None:
    """Two inlet processes: one moves the queue (the upkeep lease); kill -9 it and the other
    carries on from the state in Redis, and the pace never passes the rate (the credit is kept
    in Redis, not in the process)."""
    await engine.load_item(open_item(total=10_000, waiting_room=True))
    queues = Queues(engine)
    await join_all(queues, [f"b{i}" for i in range(1000)])

    async def frontier() -> int:
        front = await queues.front(1)
        assert front is not None
        return front.admitted_up_to

    started = time.monotonic()
    with (
        # Data directories of their own: each migrates its own embedded SQLite file at start.
        inlet_process(redis_server.url, tmp_path / "first", tmp_path / "first.log") as first,
        inlet_process(redis_server.url, tmp_path / "second", tmp_path / "second.log"),
    ):

        async def moving() -> bool:
            return await frontier() > 60

        await wait_until(moving, 20, "the first steps")
        first.send_signal(signal.SIGKILL)  # the holder, or not: the queue must go on either way
        killed_at = await frontier()

        async def moving_again() -> bool:
            return await frontier() > killed_at + 50

        await wait_until(moving_again, 20, "the steps after the kill")
        elapsed = time.monotonic() - started
        assert await frontier() <= 50 + 50 * elapsed + 1
