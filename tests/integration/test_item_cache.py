"""Item reads under a stampede: memory, then a Redis card, then SQL, loaded once per item.

SQL queries are counted for real, with a cursor event on the SQL engine; "several processes" are
real OS processes (spawned), each with its own Redis client, cache and SQL engine.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import re
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine

from seckill.domain.items import ItemRecord, NewItem
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, item_card_key, item_card_lock_key
from seckill.engine.scripts import Scripts
from seckill.redis_server import RedisServer
from seckill.services.item_cache import ItemCache, ItemSource
from seckill.services.items import UnknownItem, item_on_sale, warm_item
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.store.tables import Item
from tests.conftest import new_item
from tests.support.seckill_cli import seckill

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

_SELECT_ITEMS = re.compile(r"^\s*SELECT\b.*\bFROM items\b", re.IGNORECASE | re.DOTALL)

REDIS_SECONDS, JITTER_SECONDS = 60, 15


class SqlCounter:
    """Counts the SELECTs on ``items`` an SQL engine sends, in all and per item id."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.total = 0
        self.per_id: Counter[int] = Counter()
        self._engine = engine.sync_engine
        event.listen(self._engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if not _SELECT_ITEMS.match(statement):
            return
        self.total += 1
        values = parameters.values() if isinstance(parameters, dict) else parameters or ()
        for value in values:
            if isinstance(value, int):
                self.per_id[value] += 1

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


def make_cache(engine: RedisEngine, source: ItemSource, **overrides: Any) -> ItemCache:
    options: dict[str, Any] = {
        "local_seconds": 1.0,
        "redis_seconds": REDIS_SECONDS,
        "jitter_seconds": JITTER_SECONDS,
        "absent_seconds": 60,
        "sale_lead_seconds": REDIS_SECONDS,
    }
    return ItemCache(engine=engine, source=source, **(options | overrides))


async def create(ledger: Ledger, item: NewItem | None = None) -> ItemRecord:
    item_id = await ledger.create_item(item or new_item(total=50))
    record = await ledger.item(item_id)
    assert record is not None
    return record


async def rename(ledger: Ledger, item_id: int, name: str) -> None:
    async with ledger.engine.begin() as conn:
        await conn.execute(update(Item).where(Item.id == item_id).values(name=name))


# -- many processes at once ----------------------------------------------------------------------


def _reader_process(
    redis_url: str, sql_url: str, item_ids: list[int], barrier: Any, results: Any
) -> None:
    try:
        results.put(asyncio.run(_read_all(redis_url, sql_url, item_ids, barrier)))
    except BaseException:
        results.put({"error": traceback.format_exc()})
        raise


async def _read_all(
    redis_url: str, sql_url: str, item_ids: list[int], barrier: Any
) -> dict[str, Any]:
    pool = BlockingConnectionPool.from_url(redis_url, decode_responses=True, max_connections=64)
    redis = Redis.from_pool(pool)
    database = open_database(sql_url)
    try:
        scripts = Scripts(redis)
        await scripts.load()
        engine = RedisEngine(
            redis, scripts=scripts, idempotency_ttl_ms=60_000, prefix=DEFAULT_PREFIX
        )
        cache = make_cache(engine, Ledger(database))
        sql = SqlCounter(database)
        # Connected before the start: the race is between the reads, not the connection set-ups.
        async with database.connect():
            pass
        barrier.wait(timeout=60)  # nothing else runs on this loop yet: blocking is fine

        async def read(item_id: int) -> tuple[int, ItemRecord | None, int | None]:
            try:
                seen = await item_on_sale(cache, item_id)
            except UnknownItem:
                return (item_id, None, None)
            return (item_id, seen.record, seen.available)

        answers = await asyncio.gather(*(read(i) for i in item_ids))
        return {
            "sql": sql.total,
            "sql_per_id": dict(sql.per_id),
            "stats": cache.stats.snapshot(),
            "answers": Counter(answers),
        }
    finally:
        await redis.aclose()
        await database.dispose()


async def read_in_processes(
    redis_url: str, sql_url: str, per_process: Sequence[list[int]]
) -> list[dict[str, Any]]:
    """Each list of ids read by one spawned process, all of them concurrently, all processes
    starting together; what each saw and counted."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(per_process))
    results = context.Queue()
    processes = [
        context.Process(target=_reader_process, args=(redis_url, sql_url, ids, barrier, results))
        for ids in per_process
    ]
    for process in processes:
        process.start()
    try:
        found = [await asyncio.to_thread(results.get, timeout=120) for _ in processes]
    finally:
        for process in processes:
            await asyncio.to_thread(process.join, 30)
            if process.is_alive():
                process.kill()
    errors = [f["error"] for f in found if "error" in f]
    assert not errors, "\n".join(errors)
    return found


def summed(found: list[dict[str, Any]], key: str) -> Counter[Any]:
    total: Counter[Any] = Counter()
    for f in found:
        total.update(f[key])
    return total


@pytest.mark.redis_variants("redis7")
async def test_10000_readers_of_a_cold_item_in_two_processes_query_sql_once(
    redis_server: RedisServer, engine: RedisEngine, ledger: Ledger, sql_url: str
) -> None:
    record = await create(ledger)
    await engine.load_item(record.sale_item())  # on sale, but never read: no card anywhere

    found = await read_in_processes(
        redis_server.url, sql_url, [[record.item_id] * 5_000, [record.item_id] * 5_000]
    )

    assert sum(f["sql"] for f in found) == 1
    assert summed(found, "answers") == {(record.item_id, record, record.total): 10_000}
    stats = summed(found, "stats")
    assert stats["sql_loads"] == 1
    assert stats["unlocked_loads"] == 0
    # Every read counted once: the loader's, the other process's card hit, and the rest shared.
    reads = ("local_hits", "absent_hits", "coalesced", "redis_hits", "stale_hits", "sql_loads")
    assert sum(stats[k] for k in reads) == 10_000
    assert stats["redis_hits"] == 1


@pytest.mark.redis_variants("redis7")
async def test_unknown_ids_query_sql_once_per_id_per_absence_ttl(
    redis_server: RedisServer, redis: Redis, ledger: Ledger, sql_url: str
) -> None:
    await create(ledger)  # SQL is not empty; the ids asked for are not in it
    unknown = random.sample(range(10**9, 2 * 10**9), 200)
    reads = [i for i in unknown for _ in range(25)]
    random.shuffle(reads)

    found = await read_in_processes(redis_server.url, sql_url, [reads[::2], reads[1::2]])

    per_id = summed(found, "sql_per_id")
    assert set(per_id) == set(unknown)  # each asked once (the absence TTL, 60 s, did not pass)
    assert max(per_id.values()) == 1
    assert sum(f["sql"] for f in found) == 200
    assert summed(found, "answers") == {(i, None, None): 25 for i in unknown}
    card = json.loads(await redis.get(item_card_key(unknown[0], DEFAULT_PREFIX)))
    assert card["absent"] is True
    assert 0 < await redis.pttl(item_card_key(unknown[0], DEFAULT_PREFIX)) <= 60_000


# -- one process: the lock, stale cards, the TTLs -------------------------------------------------


class GatedSource:
    """The ledger behind a gate the test opens: an SQL load that takes as long as the test says."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def item(self, item_id: int) -> ItemRecord | None:
        self.entered.set()
        await self.gate.wait()
        return await self.ledger.item(item_id)


async def test_a_lock_left_by_a_dead_owner_lapses_and_another_loader_proceeds(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    record = await create(ledger)
    lock = item_card_lock_key(record.item_id, DEFAULT_PREFIX)
    # A loader took the lock and died: nobody will release it, it lapses after 1 s (long
    # enough that the loaders below find it held even on a machine that stalls them a while).
    await redis.set(lock, "dead-owner", px=1000)
    sql = SqlCounter(ledger.engine)
    cache = make_cache(engine, ledger, wait_seconds=10, poll_seconds=0.02)

    started = time.monotonic()
    seen = await asyncio.gather(*(cache.record(record.item_id) for _ in range(100)))
    elapsed = time.monotonic() - started

    assert seen == [record] * 100
    assert 0.9 < elapsed < 5  # after the lapse, long before the 10 s wait runs out
    assert sql.total == 1
    assert cache.stats.sql_loads == 1 and cache.stats.unlocked_loads == 0
    assert cache.stats.lock_waits == 1 and cache.stats.coalesced == 99
    assert (
        await redis.get(item_card_key(record.item_id, DEFAULT_PREFIX)) is not None
    )  # the new owner wrote it
    assert await redis.exists(lock) == 0  # and released its lock


async def test_a_reader_never_waits_on_a_stuck_lock_longer_than_its_wait(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    record = await create(ledger)
    lock = item_card_lock_key(record.item_id, DEFAULT_PREFIX)
    await redis.set(lock, "stuck-owner", px=60_000)  # alive, but its load never ends
    cache = make_cache(engine, ledger, wait_seconds=0.3, poll_seconds=0.02)

    started = time.monotonic()
    assert await cache.record(record.item_id) == record
    assert 0.3 <= time.monotonic() - started < 2
    assert cache.stats.unlocked_loads == 1 and cache.stats.sql_loads == 1
    # Only the lock's owner writes the card: this load might be older than the owner's.
    assert await redis.get(item_card_key(record.item_id, DEFAULT_PREFIX)) is None
    assert await redis.get(lock) == "stuck-owner"


async def test_a_stale_card_is_served_while_another_process_reloads_it(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    old = await create(ledger)
    await make_cache(engine, ledger).refresh(old.item_id)
    # Time passed: 5 s are left of the card's TTL, within its stale last stretch (one TTL).
    await redis.pexpire(item_card_key(old.item_id, DEFAULT_PREFIX), 5_000)
    await rename(ledger, old.item_id, "Renamed")
    slow = GatedSource(ledger)
    loader = make_cache(engine, slow)  # a process whose SQL load is slow
    other = make_cache(engine, ledger)  # another process

    loading = asyncio.gather(*(loader.record(old.item_id) for _ in range(100)))
    await asyncio.wait_for(slow.entered.wait(), 5)  # the loader holds the lock, inside SQL
    served = await asyncio.wait_for(
        asyncio.gather(*(other.record(old.item_id) for _ in range(100))), 2
    )
    assert served == [old] * 100  # at once, stale, without waiting for the slow load
    assert other.stats.stale_hits == 1 and other.stats.sql_loads == 0

    slow.gate.set()
    loaded = await asyncio.wait_for(loading, 5)
    assert {r.name for r in loaded} == {"Renamed"}
    assert loader.stats.sql_loads == 1 and loader.stats.coalesced == 99
    third = make_cache(engine, ledger)
    assert (await third.record(old.item_id)) == loaded[0]
    assert third.stats.redis_hits == 1


async def test_a_stale_card_is_served_at_once_while_sql_turns_are_all_taken(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    busy, stale = await create(ledger), await create(ledger)
    await make_cache(engine, ledger).refresh(stale.item_id)
    await redis.pexpire(
        item_card_key(stale.item_id, DEFAULT_PREFIX), 5_000
    )  # in its stale last stretch
    slow = GatedSource(ledger)
    cache = make_cache(engine, slow, max_sql_loads=1)

    hogging = asyncio.create_task(cache.record(busy.item_id))  # takes the one SQL turn
    await asyncio.wait_for(slow.entered.wait(), 5)
    assert await asyncio.wait_for(cache.record(stale.item_id), 1) == stale
    assert cache.stats.stale_hits == 1

    slow.gate.set()
    assert await hogging == busy


async def test_with_no_card_at_all_readers_wait_for_the_loader_and_never_error(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    record = await create(ledger)
    slow = GatedSource(ledger)
    loader = make_cache(engine, slow)
    other = make_cache(engine, ledger, wait_seconds=5, poll_seconds=0.02)

    loading = asyncio.gather(*(loader.record(record.item_id) for _ in range(100)))
    await asyncio.wait_for(slow.entered.wait(), 5)
    waiting = asyncio.gather(*(other.record(record.item_id) for _ in range(100)))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # nothing stale to serve: they wait for the card
    slow.gate.set()

    assert await asyncio.wait_for(loading, 5) == [record] * 100
    assert await asyncio.wait_for(waiting, 5) == [record] * 100
    assert other.stats.lock_waits == 1 and other.stats.redis_hits == 1
    assert other.stats.sql_loads == 0


async def test_an_absent_id_is_asked_of_sql_again_once_its_absence_expires(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    sql = SqlCounter(ledger.engine)
    cache = make_cache(engine, ledger, absent_seconds=1, local_seconds=0.2)
    unknown = 424_242_424

    assert await cache.record(unknown) is None
    assert await make_cache(engine, ledger).record(unknown) is None  # another process: Redis
    assert await cache.record(unknown) is None  # memory
    assert sql.per_id[unknown] == 1
    assert 0 < await redis.pttl(item_card_key(unknown, DEFAULT_PREFIX)) <= 1_000

    await asyncio.sleep(1.1)
    assert await cache.record(unknown) is None
    assert sql.per_id[unknown] == 2
    assert cache.stats.absent_hits == 1 and cache.stats.sql_loads == 2


def _window(starts_in: timedelta, ends_in: timedelta) -> NewItem:
    now = datetime.now(UTC)
    base = new_item()
    return NewItem(
        name=base.name, price_cents=base.price_cents, total=base.total,
        starts_at=now + starts_in, ends_at=now + ends_in,
        per_buyer_limit=base.per_buyer_limit, hold_seconds=base.hold_seconds,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("starts_in", "ends_in", "outlasts_the_sale"),
    [
        pytest.param(timedelta(minutes=-1), timedelta(hours=6), True, id="on sale"),
        pytest.param(timedelta(seconds=30), timedelta(hours=6), True, id="starts within the lead"),
        pytest.param(timedelta(minutes=2), timedelta(hours=6), True, id="would expire in it"),
        pytest.param(timedelta(days=3), timedelta(days=4), False, id="starts in days"),
        pytest.param(timedelta(hours=-2), timedelta(hours=-1), False, id="ended"),
    ],
)
async def test_a_card_does_not_expire_during_its_sale(
    engine: RedisEngine,
    ledger: Ledger,
    redis: Redis,
    starts_in: timedelta,
    ends_in: timedelta,
    outlasts_the_sale: bool,
) -> None:
    record = await create(ledger, _window(starts_in, ends_in))
    await make_cache(engine, ledger).refresh(record.item_id)

    ttl_ms = await redis.pttl(item_card_key(record.item_id, DEFAULT_PREFIX))
    usual_ms = (REDIS_SECONDS + JITTER_SECONDS + REDIS_SECONDS) * 1000  # fresh, jitter, stale
    if outlasts_the_sale:
        assert ttl_ms > ends_in.total_seconds() * 1000
    else:
        assert (REDIS_SECONDS * 2 - 1) * 1000 < ttl_ms <= usual_ms


async def test_cards_expire_apart(engine: RedisEngine, ledger: Ledger) -> None:
    cache = make_cache(engine, ledger)
    record = await create(ledger, _window(timedelta(days=3), timedelta(days=4)))
    now_ms = int(time.time() * 1000)
    lifetimes = {cache.card_lifetime_ms(record, now_ms) for _ in range(50)}
    assert len(lifetimes) > 1
    assert all(
        REDIS_SECONDS * 1000 <= t <= (REDIS_SECONDS + JITTER_SECONDS) * 1000 for t in lifetimes
    )


async def test_warming_with_force_rewrites_the_card(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    record = await create(ledger)
    cache = make_cache(engine, ledger)
    assert await warm_item(engine, ledger, record.item_id, cache=cache) is Outcome.LOADED
    assert await make_cache(engine, ledger).record(record.item_id) == record
    await engine.reserve(
        record.item_id, buyer="alice", quantity=1, idempotency_key="k", order_id=7 << 22
    )
    await rename(ledger, record.item_id, "Renamed")

    with pytest.raises(InvalidRequest) as refused:
        await warm_item(engine, ledger, record.item_id, cache=cache)
    assert refused.value.code is ErrorCode.ITEM_ACTIVE
    assert (await make_cache(engine, ledger).record(record.item_id)) == record  # unchanged

    outcome = await warm_item(engine, ledger, record.item_id, force=True, cache=cache)
    assert outcome is Outcome.RELOADED
    reader = make_cache(engine, ledger)
    renamed = await reader.record(record.item_id)
    assert renamed is not None and renamed.name == "Renamed"
    assert reader.stats.redis_hits == 1
    assert (await cache.record(record.item_id)) == renamed  # and the warming process's memory


async def test_available_is_read_live_and_shared_by_concurrent_readers(
    engine: RedisEngine, ledger: Ledger, redis: Redis
) -> None:
    record = await create(ledger)
    await engine.load_item(record.sale_item())
    cache = make_cache(engine, ledger)
    await cache.record(record.item_id)

    # Redis counts the commands it runs (on a cluster, the item's node does)
    on_node: dict[str, Any] = {}
    if isinstance(redis, RedisCluster):
        on_node["target_nodes"] = redis.get_node_from_key(engine.keys(record.item_id).item)
    await redis.config_resetstat(**on_node)
    seen = await asyncio.gather(*(item_on_sale(cache, record.item_id) for _ in range(500)))
    stats = await redis.info("commandstats", **on_node)
    assert {s.available for s in seen} == {record.total}
    assert stats["cmdstat_hget"]["calls"] == 1

    await engine.reserve(
        record.item_id, buyer="bob", quantity=1, idempotency_key="k", order_id=9 << 22
    )
    assert (await item_on_sale(cache, record.item_id)).available == record.total - 1


# -- warm-up -------------------------------------------------------------------------------------


async def test_items_on_sale_are_those_not_ended(ledger: Ledger) -> None:
    ended = await create(ledger, _window(timedelta(hours=-2), timedelta(hours=-1)))
    later = await create(ledger, _window(timedelta(days=1), timedelta(days=2)))
    now = await create(ledger, _window(timedelta(minutes=-1), timedelta(hours=1)))
    on_sale = await ledger.items_on_sale(datetime.now(UTC))
    assert on_sale == [now, later]
    assert ended not in on_sale


@pytest.mark.redis_variants("redis7")
async def test_seckill_warm_loads_every_item_not_ended_with_its_card(
    redis_server: RedisServer,
    redis: Redis,
    engine: RedisEngine,
    ledger: Ledger,
    sql_url: str,
    tmp_path: Path,
) -> None:
    ended = await create(ledger, _window(timedelta(hours=-2), timedelta(hours=-1)))
    later = await create(ledger, _window(timedelta(days=1), timedelta(days=2)))
    now = await create(ledger, _window(timedelta(minutes=-1), timedelta(hours=1)))

    def seckill_warm() -> subprocess.CompletedProcess[str]:
        return seckill("warm", redis_url=redis_server.url, sql_url=sql_url, data_dir=tmp_path)

    run = await asyncio.to_thread(seckill_warm)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {int(line.split()[1]): line for line in run.stdout.splitlines() if "│ " in line
            and line.split()[1].isdigit()}  # fmt: skip
    assert set(rows) == {now.item_id, later.item_id}
    assert "loaded" in rows[now.item_id]
    for record in (now, later):
        assert await engine.stock(record.item_id) is not None
    assert (
        await redis.pttl(item_card_key(now.item_id, DEFAULT_PREFIX)) > 3_600_000
    )  # outlasts its sale
    assert (
        0 < await redis.pttl(item_card_key(later.item_id, DEFAULT_PREFIX)) <= 135_000
    )  # starts in a day
    assert await engine.stock(ended.item_id) is None
    assert await redis.exists(item_card_key(ended.item_id, DEFAULT_PREFIX)) == 0

    # Selling already: kept as it is (its holds stay), and still given its card.
    await engine.reserve(now.item_id, buyer="carol", quantity=1, idempotency_key="k", order_id=1)
    await redis.delete(item_card_key(now.item_id, DEFAULT_PREFIX))
    again = await asyncio.to_thread(seckill_warm)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "item_active" in again.stdout
    assert await redis.exists(item_card_key(now.item_id, DEFAULT_PREFIX)) == 1
