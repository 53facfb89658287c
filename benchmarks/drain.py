"""Drain rate: a backlog of reserved orders landed in MariaDB, beside a raw INSERT rate.

Two figures against the same SQL server, in the same run:

* ``orders_per_s``: N ``reserved`` events waiting in an item's stream (made beforehand through
  ``RedisEngine.reserve``, with no persister running) are landed by ``Persister.run_once`` until
  the stream is fully acknowledged: XREADGROUP, ``Ledger.apply`` (dedup SELECT, order locks,
  journal and order inserts, the inventory update, one transaction per batch), XACK.
* ``raw_insert_rows_per_s``: N rows shaped like ``orders`` (same columns, types and indexes, no
  foreign keys) inserted through the same driver, in batches of the same size, one transaction
  per batch, with rows built before the clock starts. About what the server and driver can take.

``ratio`` is the first over the second. The persister writes two rows per order (the order and
its journal row) and reads before it writes, so it cannot reach 1; a low ratio says the time goes
into the persister's own work rather than into the server.

Wall-clock figures depend on what else the machine runs, so the summary also prints this
process's CPU per order during the drain and the load average before it.

The script starts its own redis-server on a free loopback port, and creates a database of its own
on the SQL server (dropped afterwards); it touches nothing else. The last line printed is one JSON
object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from sqlalchemy import Column, Index, MetaData, Table, insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.harness import run_on_private_redis
from seckill.domain.ids import OrderIds
from seckill.domain.items import NewItem
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.scripts import Scripts
from seckill.engine.streams import GROUP
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.store.database import create_database, drop_database, open_database
from seckill.store.ledger import Ledger
from seckill.store.migrate import upgrade
from seckill.store.tables import Order
from seckill.workers.persister import Persister, PersisterConfig

DEFAULT_URL = "mysql+asyncmy://root@127.0.0.1:3306/test"
IDEMPOTENCY_TTL_MS = 3_600_000
PRICE_CENTS = 100
CONCURRENCY = 64  # reservations in flight while the backlog is built
MAX_FAILED_PASSES = 10  # a persister pass that keeps failing ends the run instead of spinning


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=100_000, help="reserved orders to drain")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("SECKILL_TEST_MARIADB_URL") or DEFAULT_URL,
        help="SQL server to use; a fresh database is created on it (default: "
        "$SECKILL_TEST_MARIADB_URL, else %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=1000, help="entries per transaction")
    parser.add_argument(
        "--persisters",
        type=int,
        default=1,
        help="Persister instances run concurrently as asyncio tasks in this one process",
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("orders", "batch_size", "persisters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# -- the scratch database ------------------------------------------------------------------------


async def server_version(database: AsyncEngine) -> str:
    """``mariadb 10.11.19`` from ``10.11.19-MariaDB-0+deb12u1``."""
    async with database.connect() as conn:
        raw = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
    product = "mariadb" if "mariadb" in raw.lower() else database.dialect.name
    return f"{product} {raw.split('-')[0]}"


# -- the backlog ---------------------------------------------------------------------------------


async def build_backlog(engine: RedisEngine, item_id: int, orders: int) -> Counter[str]:
    """``orders`` reservations from distinct buyers, ``CONCURRENCY`` in flight."""
    order_ids = OrderIds(worker_id=1)
    numbers = iter(range(orders))  # shared: a task takes the next buyer as soon as it is free
    outcomes: Counter[str] = Counter()

    async def buyer() -> None:
        for i in numbers:
            reservation = await engine.reserve(
                item_id, buyer=f"b{i}", quantity=1, idempotency_key=f"k{i}",
                order_id=order_ids.next(),
            )  # fmt: skip
            outcomes[reservation.outcome.value] += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENCY):
            group.create_task(buyer())
    return outcomes


# -- the drain -----------------------------------------------------------------------------------


async def fully_acknowledged(redis: Redis, stream: str) -> bool:
    """Every entry of the stream delivered to the persister group and acknowledged."""
    groups: list[dict[str, Any]] = await redis.xinfo_groups(stream)
    info: dict[str, Any] = await redis.xinfo_stream(stream)
    group = next((g for g in groups if g["name"] == GROUP), None)
    return (
        group is not None
        and group["pending"] == 0
        and group["last-delivered-id"] == info["last-generated-id"]
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Drained:
    seconds: float  # wall clock, until the stream was fully acknowledged
    cpu_seconds: float  # this process's CPU over the same span (the server's is not in it)
    landed: list[int]  # entries each persister acknowledged
    failures: list[str]  # passes that raised (and were retried)


async def drain(
    redis: Redis, ledger: Ledger, *, stream: str, entries: int, persisters: int, batch_size: int
) -> Drained:
    """``persisters`` Persisters share the group until it has acknowledged every entry."""
    config = PersisterConfig(batch_size=batch_size, block_ms=50)
    workers = [
        Persister(redis=redis, ledger=ledger, consumer=f"drain-{i}", config=config)
        for i in range(persisters)
    ]
    drained = asyncio.Event()
    finished_at = finished_cpu = 0.0
    failures: list[str] = []

    async def run(worker: Persister) -> None:
        nonlocal finished_at, finished_cpu
        while not drained.is_set():
            try:
                landed = await worker.run_once()
            except Exception as exc:
                # As the workers' loop does: a failed pass is reported and the next one runs.
                failures.append(f"{worker.consumer}: {type(exc).__name__}: {exc}")
                if len(failures) > MAX_FAILED_PASSES:
                    raise
                continue
            # XINFO only when it can say yes: everything landed somewhere, or nothing came.
            maybe_done = landed == 0 or sum(w.landed for w in workers) >= entries
            if maybe_done and await fully_acknowledged(redis, stream) and not drained.is_set():
                finished_at, finished_cpu = time.perf_counter(), time.process_time()
                drained.set()

    started, started_cpu = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as group:
        for worker in workers:
            group.create_task(run(worker))
    return Drained(
        seconds=finished_at - started,
        cpu_seconds=finished_cpu - started_cpu,
        landed=[w.landed for w in workers],
        failures=failures,
    )


# -- the raw INSERT rate -------------------------------------------------------------------------


def raw_orders_table() -> Table:
    """A table shaped like ``orders``: same columns, types, key and indexes; no FK or checks."""
    source = cast(Table, Order.__table__)
    table = Table(
        "raw_orders",
        MetaData(),
        *(
            Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable,
                   autoincrement=False)
            for c in source.columns
        ),
    )  # fmt: skip
    for index in source.indexes:
        Index(f"ix_raw_{index.name}", *(table.c[c.name] for c in index.columns))
    return table


def raw_rows(orders: int, item_id: int) -> list[dict[str, Any]]:
    """What the persister writes for a fresh reservation, one dict per order."""
    order_ids = OrderIds(worker_id=2)
    now = datetime.now(UTC)
    deadline = now + timedelta(hours=1)
    return [
        {
            "id": order_ids.next(), "item_id": item_id, "buyer": f"b{i}", "quantity": 1,
            "price_cents": PRICE_CENTS, "status": "held", "release_reason": None,
            "deadline_at": deadline, "reserved_at": now, "paid_at": None, "released_at": None,
            "updated_at": now,
        }
        for i in range(orders)
    ]  # fmt: skip


async def raw_insert(database: AsyncEngine, rows: list[dict[str, Any]], batch_size: int) -> float:
    """Seconds to insert ``rows`` in batches, one transaction per batch."""
    table = raw_orders_table()
    async with database.begin() as conn:
        await conn.run_sync(table.metadata.create_all)
    statement = insert(table)
    started = time.perf_counter()
    for start in range(0, len(rows), batch_size):
        async with database.begin() as conn:
            await conn.execute(statement, rows[start : start + batch_size])
    seconds = time.perf_counter() - started
    async with database.connect() as conn:
        count = (await conn.execute(text("SELECT COUNT(*) FROM raw_orders"))).scalar_one()
    if count != len(rows):
        sys.exit(f"raw insert check failed: {count} rows in raw_orders, expected {len(rows)}")
    return seconds


# -- the run -------------------------------------------------------------------------------------


async def measure_on(
    database: AsyncEngine, redis: Redis, args: argparse.Namespace
) -> dict[str, Any]:
    n = args.orders
    version = await server_version(database)
    # MariaDB notes each named primary key it ignores, and asyncmy logs every note as a warning.
    driver_log = logging.getLogger("asyncmy")
    level = driver_log.level
    driver_log.setLevel(logging.ERROR)
    try:
        await upgrade(database)
    finally:
        driver_log.setLevel(level)
    ledger = Ledger(database)
    now = datetime.now(UTC)
    item_id = await ledger.create_item(
        NewItem(
            name="drain benchmark", price_cents=PRICE_CENTS, total=n,
            starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
            per_buyer_limit=1, hold_seconds=3600,
        )
    )  # fmt: skip
    scripts = Scripts(redis)
    await scripts.load()
    engine = RedisEngine(redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS)
    outcome = await warm_item(engine, ledger, item_id)
    if outcome is not Outcome.LOADED:
        sys.exit(f"item {item_id} did not load on a fresh Redis: {outcome}")

    started = time.perf_counter()
    outcomes = await build_backlog(engine, item_id, n)
    backlog_s = time.perf_counter() - started
    if outcomes != Counter({Outcome.RESERVED.value: n}):
        sys.exit(f"backlog check failed: expected {n} reservations, got {outcomes}")
    stream = engine.keys(item_id).events
    entries = int(await redis.xlen(stream))  # the reservations and the item's `loaded` event
    print(f"{version}; backlog: {n} reservations in {backlog_s:.1f} s ({entries} stream entries)")

    load = os.getloadavg()[0]
    drained = await drain(
        redis, ledger, stream=stream, entries=entries, persisters=args.persisters,
        batch_size=args.batch_size,
    )  # fmt: skip
    orders = await ledger.orders(item_id)
    sql_stock, redis_stock = await ledger.stock(item_id), await engine.stock(item_id)
    if len(orders) != n:
        sys.exit(f"drain check failed: {len(orders)} orders in SQL, expected {n}")
    if sql_stock != redis_stock:
        sys.exit(f"drain check failed: SQL stock {sql_stock} != Redis stock {redis_stock}")
    orders_per_s = n / drained.seconds
    print(
        f"drain   {n} orders, batch {args.batch_size}, {args.persisters} persister(s): "
        f"{drained.seconds:.2f} s, {orders_per_s:,.0f} orders/s"
    )
    print(
        f"        Python CPU {drained.cpu_seconds:.2f} s ({1e6 * drained.cpu_seconds / n:.0f} us "
        f"per order); load average {load:.1f} on {os.cpu_count()} CPUs before the drain"
    )
    print(
        f"        {len(orders)} orders in SQL, stock {sql_stock} matches Redis; entries landed "
        f"per persister: {', '.join(map(str, drained.landed))}"
    )
    for failure in drained.failures:
        print(f"        failed pass (retried): {failure}")

    rows = raw_rows(n, item_id)
    raw_s = await raw_insert(database, rows, args.batch_size)
    raw_per_s = n / raw_s
    print(f"raw     {n} rows, batch {args.batch_size}: {raw_s:.2f} s, {raw_per_s:,.0f} rows/s")
    ratio = orders_per_s / raw_per_s
    print(f"ratio   {ratio:.3f} (drain / raw insert)")
    return {
        "orders_per_s": round(orders_per_s, 1),
        "raw_insert_rows_per_s": round(raw_per_s, 1),
        "ratio": round(ratio, 3),
        "orders": n,
        "batch_size": args.batch_size,
        "persisters": args.persisters,
        "database": version,
    }


async def measure(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    name = f"seckill_bench_{secrets.token_hex(4)}"
    url = await create_database(args.database_url, name)
    try:
        database = open_database(url, pool_size=max(10, args.persisters + 2))
        pool = BlockingConnectionPool.from_url(
            server.url, decode_responses=True, max_connections=CONCURRENCY
        )
        redis = Redis.from_pool(pool)
        try:
            return await measure_on(database, redis, args)
        finally:
            await redis.aclose()
            await database.dispose()
    finally:
        await drop_database(args.database_url, name)


def main(argv: list[str] | None = None) -> None:
    run_on_private_redis(measure, parse_args(argv))


if __name__ == "__main__":
    main()
