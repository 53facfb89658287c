"""Persister processes killed with SIGKILL mid-batch, again and again, while buyers keep coming:
once the survivors drain, every accepted reservation has exactly one order, and nothing more.

The persisters are real ``seckill worker persister`` subprocesses, so a kill is a real crash: no
``finally``, no XACK, a SQL transaction cut off wherever it was. What a killed persister had read
but not acknowledged stays pending under its name until a live one takes it with XAUTOCLAIM.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy import func, select

from seckill.domain.events import ReleaseReason
from seckill.domain.holds import HoldState
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.streams import GROUP, stream_drained
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.store.ledger import Ledger
from seckill.store.tables import Order, StockFlow
from tests.conftest import new_item, pay
from tests.support.polling import wait_until
from tests.support.sales import Sale, assert_sql_matches_redis

PERSISTER = [
    sys.executable, "-m", "seckill.cli", "worker", "persister",
    "--claim-idle-ms", "300", "--batch-size", "50",
]  # fmt: skip
LIVE = 2  # persisters running at any time
KILLS = 6  # each replacement takes seconds to start: twice as many only doubled the time
# The six kills take about 5 s, as long as some 1,500 reservations: the load lasts that long
# whatever its floor, and a longer one only added seconds after the last kill.
UNITS = 800  # sells out near the middle of the load: the ledger then works with counters near zero
MIN_RESERVATIONS = 1_500  # the load goes on at least this long, and until the last kill
MAX_RESERVATIONS = 60_000  # a load that outlasts this means the kills never found work in flight
CHUNK = 10  # reservations sent at once, between short pauses
WORKER_ID = 917  # order ids of this module's load; no other test issues ids with it
DRAIN_LIMIT_S = 60
STOP_LIMIT_S = 5


class Persisters:
    """The persister subprocesses of one test, each logging to its own file."""

    def __init__(self, *, env: dict[str, str], logs: Path) -> None:
        self._env = env
        self._logs = logs
        self.live: list[subprocess.Popen[bytes]] = []
        self.started: list[subprocess.Popen[bytes]] = []

    def _log(self, n: int) -> Path:
        return self._logs / f"persister-{n}.log"

    def start(self) -> None:
        with self._log(len(self.started)).open("wb") as out:
            proc = subprocess.Popen(PERSISTER, env=self._env, stdout=out, stderr=out)
        self.live.append(proc)
        self.started.append(proc)

    async def crash(self, victim: subprocess.Popen[bytes]) -> None:
        """SIGKILL one, wait for it, start its replacement."""
        victim.kill()
        assert await wait_exit(victim, 5) == -signal.SIGKILL
        self.live.remove(victim)
        self.start()

    async def ready(self, within: float) -> None:
        """Wait until every live persister has said it started: before that a SIGTERM finds
        Python still importing, with no handler yet, and ends it by the signal."""

        async def all_started() -> bool:
            logs = [self._log(self.started.index(proc)) for proc in self.live]
            return all(b"persister started" in log.read_bytes() for log in logs)

        await wait_until(all_started, within, "the persisters starting")

    def kill_leftovers(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- persister {n} (pid {proc.pid}, exit {proc.returncode}) ---\n"
            + self._log(n).read_text(errors="replace")
            for n, proc in enumerate(self.started)
        )


async def wait_exit(proc: subprocess.Popen[bytes], within: float) -> int | None:
    """The exit code, or None if the process is still running after ``within`` seconds."""
    try:
        return await asyncio.to_thread(proc.wait, within)
    except subprocess.TimeoutExpired:
        return None


async def pending_by_pid(redis: Redis, stream: str) -> dict[int, int]:
    """Entries read but not acknowledged, per persister process; its consumer name carries the
    pid: ``<host>-<pid>-<random>``."""
    try:
        consumers = cast(list[dict[str, Any]], await redis.xinfo_consumers(stream, GROUP))
    except ResponseError:  # no group before the first persister has started
        return {}
    return {int(c["name"].rsplit("-", 2)[1]): int(c["pending"]) for c in consumers}


@dataclass
class Load:
    """What the buyers were told; the record must agree with every answer."""

    reservations: int = 0
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    told: dict[int, tuple[str, int, HoldState]] = field(default_factory=dict)


async def run_load(sale: Sale, kills_done: asyncio.Event, rng: random.Random) -> Load:
    load = Load()
    open_holds: list[int] = []
    reasons = list(ReleaseReason)

    async def reserve(buyer: str, quantity: int) -> None:
        answer = await sale.engine.reserve(
            sale.item_id,
            buyer=buyer,
            quantity=quantity,
            idempotency_key="k",
            order_id=sale.ids.next(),
        )
        load.outcomes[answer.outcome] += 1
        if answer.accepted:
            assert answer.order_id is not None
            load.told[answer.order_id] = (buyer, quantity, HoldState.HELD)
            open_holds.append(answer.order_id)

    async def settle(order_id: int) -> None:
        buyer, quantity, _ = load.told[order_id]
        if rng.random() < 0.6:
            answer = await pay(sale.engine, sale.item_id, order_id)
            assert answer.outcome is Outcome.PAID
            load.told[order_id] = (buyer, quantity, HoldState.PAID)
        else:
            answer = await sale.engine.release(sale.item_id, order_id, rng.choice(reasons))
            assert answer.outcome is Outcome.RELEASED
            load.told[order_id] = (buyer, quantity, HoldState.RELEASED)

    while load.reservations < MIN_RESERVATIONS or not kills_done.is_set():
        assert load.reservations < MAX_RESERVATIONS, "the kills did not finish during the load"
        buyers = range(load.reservations, load.reservations + CHUNK)
        await asyncio.gather(*(reserve(f"buyer-{n}", rng.choice((1, 2))) for n in buyers))
        load.reservations += CHUNK
        # Settle two thirds of the open holds, old and new, so `paid` and `released` land in the
        # batch of their `reserved` or a later one, on the same persister or another; the rest
        # stays held a while longer, some to the end.
        rng.shuffle(open_holds)
        settling = [open_holds.pop() for _ in range(len(open_holds) * 2 // 3)]
        await asyncio.gather(*(settle(order_id) for order_id in settling))
        await asyncio.sleep(rng.uniform(0.015, 0.035))
    return load


async def kill_persisters(
    persisters: Persisters, redis: Redis, stream: str, rng: random.Random
) -> list[int]:
    """KILLS times: after 50-200 ms, SIGKILL a persister that has entries read and not yet
    acknowledged (a batch in hand), then start another. Returns each victim's entries in hand."""
    in_hand: list[int] = []
    for _ in range(KILLS):
        await asyncio.sleep(rng.uniform(0.05, 0.2))
        # A replacement needs a few seconds to import and connect before it reads anything.
        async with asyncio.timeout(30):
            while True:
                pending = await pending_by_pid(redis, stream)
                busy = [p for p in persisters.live if pending.get(p.pid, 0) > 0]
                if busy:
                    break
                await asyncio.sleep(0.005)
        victim = rng.choice(busy)
        in_hand.append(pending[victim.pid])
        await persisters.crash(victim)
    return in_hand


@pytest.mark.redis_variants("redis7")  # one Redis is enough here
async def test_kill_9_of_persisters_mid_batch_loses_and_duplicates_nothing(
    redis_server: RedisServer,
    redis: Redis,
    engine: RedisEngine,
    ledger: Ledger,
    sql_url: str,
    tmp_path: Path,
) -> None:
    version = (await redis.info("server"))["redis_version"]
    assert version.startswith("7."), f"meant for Redis 7 alone, got {version}"
    item_id = await ledger.create_item(new_item(total=UNITS, limit=2))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(WORKER_ID))
    stream = engine.keys(item_id).events
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {
        "SECKILL_REDIS_URL": redis_server.url,
        "SECKILL_DATABASE_URL": sql_url,
        "SECKILL_DATA_DIR": str(tmp_path),
        "PYTHONFAULTHANDLER": "1",  # a persister that hangs can be made to say where
    }
    persisters = Persisters(env=env, logs=tmp_path)
    rng = random.Random(9)
    try:
        for _ in range(LIVE):
            persisters.start()
        kills_done = asyncio.Event()
        load_task = asyncio.create_task(run_load(sale, kills_done, random.Random(rng.random())))
        try:
            in_hand = await kill_persisters(persisters, redis, stream, rng)
        finally:
            kills_done.set()
        load = await load_task
        assert len(in_hand) == KILLS and min(in_hand) > 0  # every kill cut a batch short
        assert load.outcomes[Outcome.SOLD_OUT] > 0  # the sale sold out while persisters died

        try:
            async with asyncio.timeout(DRAIN_LIMIT_S):
                while not await stream_drained(redis, stream):
                    assert all(p.poll() is None for p in persisters.live), "a survivor died"
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pytest.fail(f"the survivors did not drain the stream in {DRAIN_LIMIT_S} s")
        await persisters.ready(30)
        for proc in persisters.live:
            proc.send_signal(signal.SIGTERM)
        exits = [await wait_exit(proc, STOP_LIMIT_S) for proc in persisters.live]
        for proc, code in zip(persisters.live, exits, strict=True):
            if code is None:  # hung: faulthandler writes where to its log, shown below
                proc.send_signal(signal.SIGABRT)
                await wait_exit(proc, 5)
        assert exits == [0] * LIVE, "the survivors did not stop cleanly on SIGTERM"

        # Lost nothing: Redis holds what the buyers were told, and SQL has an order for each,
        # with the same buyer, quantity and state; SQL inventory equals Redis stock.
        holds = await engine.holds(item_id)
        assert {o: (h.buyer, h.quantity, h.state) for o, h in holds.items()} == load.told
        await assert_sql_matches_redis(sale)
        states = Counter(state for _, _, state in load.told.values())
        assert states.keys() == set(HoldState), states  # held, paid and released all landed
        # Duplicated nothing: one order row per hold, one journal row per event.
        async with ledger.engine.connect() as conn:
            order_rows = await conn.scalar(
                select(func.count()).select_from(Order).where(Order.item_id == item_id)
            )
            repeated = (
                await conn.execute(
                    select(StockFlow.order_id, StockFlow.event, func.count())
                    .where(StockFlow.item_id == item_id)
                    .group_by(StockFlow.order_id, StockFlow.event)
                    .having(func.count() > 1)
                )
            ).all()
        assert order_rows == len(holds)
        assert repeated == []
        settled = states[HoldState.PAID] + states[HoldState.RELEASED]
        assert await ledger.journal_size(item_id) == 1 + len(holds) + settled
        assert await ledger.dead_letters() == []
    except BaseException:
        persisters.kill_leftovers()
        print(persisters.diagnostics())  # pytest shows it with the failure
        raise
    finally:
        persisters.kill_leftovers()
