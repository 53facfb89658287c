"""Drain rate: a backlog of reserved orders landed in SQL, beside the fastest raw writes of the
same rows.

For each SQL server given (MariaDB and PostgreSQL), in the same run:

* ``orders_per_s``: N ``reserved`` events waiting in an item's stream (made beforehand through
  ``RedisEngine.reserve``, with no persister running) are landed by ``Persister.run_once`` until
  the stream is fully acknowledged, exactly as the worker runs: XREADGROUP, ``Ledger.apply``
  (order locks, journal and order rows in bulk, the inventory update, one transaction per
  batch), XACK. ``cpu_us_per_order`` is this process's CPU over the drain, per order.
* ``raw_orders_per_s``: the very rows the drain wrote (each order's row and its journal row, read
  back from SQL) written again into the same tables, emptied first, through the driver alone:
  batches of the same size, one transaction per batch, as many writers as persisters, every row
  built before the clock starts. Several ways are measured; the fastest is the reference:
  PostgreSQL ``COPY``, ``INSERT ... SELECT FROM unnest(...)`` and executemany; MariaDB a
  multi-row INSERT sent as text, the same rows bound to one prepared statement
  (``COM_STMT_BULK_EXECUTE``) and executemany. ``raw_rows_per_s`` counts both rows of an order.

``ratio`` is ``orders_per_s`` over the fastest ``raw_orders_per_s``: the share of what the
server takes that the persister reaches, after reading the stream, locking and checking.

Wall-clock figures depend on what else the machine runs: the summary also prints the load
average before each drain.

The script starts its own redis-server on a free loopback port, and creates a database of its own
on each SQL server (dropped afterwards); it touches nothing else. The last line printed is one
JSON object with the figures, one entry per server.
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
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from sqlalchemy import Table, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.harness import profiled, py_spy, run_on_private_redis
from seckill.bootstrap.runtime import settle_heap
from seckill.domain.ids import OrderIds
from seckill.domain.items import NewItem
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.engine.streams import GROUP
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.store.database import create_database, drop_database, open_database
from seckill.store.ledger import Ledger
from seckill.store.migrate import upgrade
from seckill.store.tables import Order, StockFlow
from seckill.workers.persister import Persister, PersisterConfig

DEFAULT_URL = "mysql+asyncmy://root@127.0.0.1:3306/test"
SERVER_URL_VARIABLES = ("SECKILL_TEST_MARIADB_URL", "SECKILL_TEST_POSTGRES_URL")
IDEMPOTENCY_TTL_MS = 3_600_000
PRICE_CENTS = 100
CONCURRENCY = 64  # reservations in flight while the backlog is built
MAX_FAILED_PASSES = 10  # a persister pass that keeps failing ends the run instead of spinning


def default_urls() -> list[str]:
    return [url for name in SERVER_URL_VARIABLES if (url := os.environ.get(name))] or [DEFAULT_URL]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=100_000, help="reserved orders to drain")
    parser.add_argument(
        "--database-url",
        action="append",
        dest="database_urls",
        help="a SQL server (MariaDB or PostgreSQL) to measure on, where a fresh database is "
        "created; give it once per server (default: $SECKILL_TEST_MARIADB_URL and "
        f"$SECKILL_TEST_POSTGRES_URL, those set, else {DEFAULT_URL})",
    )
    parser.add_argument("--batch-size", type=int, default=1000, help="entries per transaction")
    parser.add_argument(
        "--persisters",
        type=int,
        default=1,
        help="Persister instances run concurrently as asyncio tasks in this one process (and "
        "as many raw writers)",
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="write a py-spy profile of this process over each drain alone (collapsed stacks) "
        "here, one file per server",
    )
    parser.add_argument(
        "--native", action="store_true", help="with --profile: native frames too (py-spy --native)"
    )
    parser.set_defaults(perf=None)  # the profiler `profiled` runs: py-spy only
    args = parser.parse_args(argv)
    if args.profile is not None and not py_spy():
        parser.error("--profile: py-spy is not installed (pip install py-spy)")
    for name in ("orders", "batch_size", "persisters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.database_urls = args.database_urls or default_urls()
    for url in args.database_urls:
        if make_url(url).get_backend_name() not in {"mysql", "mariadb", "postgresql"}:
            parser.error(f"not a MariaDB or PostgreSQL URL: {url}")
    return args


# -- the scratch database ------------------------------------------------------------------------


async def server_version(database: AsyncEngine) -> tuple[str, str]:
    """``("mariadb", "10.11.19")`` from ``10.11.19-MariaDB-0+deb12u1``; PostgreSQL's likewise."""
    async with database.connect() as conn:
        raw = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
    if database.dialect.name == "postgresql":  # "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on..."
        return "postgresql", raw.split()[1]
    return ("mariadb" if "mariadb" in raw.lower() else "mysql"), raw.split("-")[0]


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
    cpu_seconds: float  # this process's CPU over the same span (the servers' is not in it)
    landed: list[int]  # entries each persister acknowledged
    failures: list[str]  # passes that raised (and were retried)


async def drain(
    redis: Redis, ledger: Ledger, *, stream: str, entries: int, persisters: int, batch_size: int
) -> Drained:
    """``persisters`` Persisters share the group until it has acknowledged every entry."""
    config = PersisterConfig(batch_size=batch_size, block_ms=50)
    workers = [
        Persister(
            redis=redis, ledger=ledger, consumer=f"drain-{i}", config=config, prefix=DEFAULT_PREFIX
        )
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


# -- the raw writes ------------------------------------------------------------------------------
# The rows the drain wrote, read back, written again through the driver alone. A way of writing
# turns one batch of rows of one table into what it sends (untimed), then sends it (timed).

Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Landed:
    """One table's rows as the drain wrote them: values as the driver takes them."""

    table: Table
    columns: list[str]
    rows: Rows


async def landed_rows(database: AsyncEngine, item_id: int) -> list[Landed]:
    """The item's order rows and journal rows (the journal's own ids left to the database)."""
    landed = []
    for table in (Order.__table__, StockFlow.__table__):
        assert isinstance(table, Table)
        columns = [c for c in table.columns if not (c.primary_key and c.autoincrement is True)]
        async with database.connect() as conn:
            result = await conn.execute(
                select(*columns).where(table.c.item_id == item_id).order_by(*table.primary_key)
            )
            rows = [tuple(_naive(v) for v in row) for row in result]
        landed.append(Landed(table, [c.name for c in columns], rows))
    return landed


def _naive(value: Any) -> Any:
    """UTC without a zone, as the tables store times."""
    return value.replace(tzinfo=None) if isinstance(value, datetime) else value


@dataclass(frozen=True, slots=True)
class RawWay:
    name: str
    prepare: Callable[[Any, Landed, Rows], Any]  # (driver connection, table, batch) -> payload
    send: Callable[[Any, Any], Awaitable[None]]  # (driver connection, payload)


def _postgres_type(landed: Landed, column: str) -> str:
    from sqlalchemy.dialects import postgresql

    return str(landed.table.c[column].type.compile(dialect=postgresql.dialect()))


def _insert_into(landed: Landed, columns: Sequence[str], placeholders: Sequence[str]) -> str:
    return (
        f"INSERT INTO {landed.table.name} ({', '.join(columns)}) VALUES ({', '.join(placeholders)})"
    )


async def _pg_copy(driver: Any, payload: tuple[Landed, Rows]) -> None:
    landed, rows = payload
    await driver.copy_records_to_table(landed.table.name, records=rows, columns=landed.columns)


def _pg_unnest(driver: Any, landed: Landed, rows: Rows) -> tuple[str, list[list[Any]]]:
    arrays = [f"${i}::{_postgres_type(landed, c)}[]" for i, c in enumerate(landed.columns, start=1)]
    statement = (
        f"INSERT INTO {landed.table.name} ({', '.join(landed.columns)}) "
        f"SELECT * FROM unnest({', '.join(arrays)})"
    )
    return statement, [list(column) for column in zip(*rows, strict=True)]


async def _pg_execute(driver: Any, payload: tuple[str, list[list[Any]]]) -> None:
    await driver.execute(payload[0], *payload[1])


def _pg_executemany(driver: Any, landed: Landed, rows: Rows) -> tuple[str, Rows]:
    placeholders = [f"${i}" for i in range(1, len(landed.columns) + 1)]
    return _insert_into(landed, landed.columns, placeholders), rows


async def _pg_send_many(driver: Any, payload: tuple[str, Rows]) -> None:
    await driver.executemany(*payload)


def _mariadb_text(driver: Any, landed: Landed, rows: Rows) -> str:
    values = ", ".join(f"({', '.join(map(driver.literal, row))})" for row in rows)
    return f"INSERT INTO {landed.table.name} ({', '.join(landed.columns)}) VALUES {values}"


async def _mariadb_send_text(driver: Any, statement: str) -> None:
    async with driver.cursor() as cursor:
        await cursor.execute(statement)


def _mariadb_bulk(driver: Any, landed: Landed, rows: Rows) -> tuple[str, Rows]:
    # The command types each column by its values: one NULL in every row is left out.
    values = list(zip(*rows, strict=True))
    kept = [i for i, column in enumerate(values) if column.count(None) < len(column)]
    statement = _insert_into(landed, [landed.columns[i] for i in kept], ["?"] * len(kept))
    return statement, list(zip(*(values[i] for i in kept), strict=True))


async def _mariadb_send_bulk(driver: Any, payload: tuple[str, Rows]) -> None:
    prepared = await driver.prepare(payload[0])
    try:
        await prepared.execute_bulk(payload[1])
    finally:
        await prepared.close()


def _mariadb_executemany(driver: Any, landed: Landed, rows: Rows) -> tuple[str, Rows]:
    return _insert_into(landed, landed.columns, ["%s"] * len(landed.columns)), rows


async def _mariadb_send_many(driver: Any, payload: tuple[str, Rows]) -> None:
    async with driver.cursor() as cursor:
        await cursor.executemany(*payload)


RAW_WAYS = {
    "postgresql": [
        RawWay("COPY", lambda driver, landed, rows: (landed, rows), _pg_copy),
        RawWay("INSERT ... SELECT FROM unnest", _pg_unnest, _pg_execute),
        RawWay("executemany", _pg_executemany, _pg_send_many),
    ],
    "mariadb": [
        RawWay("multi-row INSERT", _mariadb_text, _mariadb_send_text),
        RawWay("COM_STMT_BULK_EXECUTE", _mariadb_bulk, _mariadb_send_bulk),
        RawWay("executemany", _mariadb_executemany, _mariadb_send_many),
    ],
    "mysql": [  # no COM_STMT_BULK_EXECUTE
        RawWay("multi-row INSERT", _mariadb_text, _mariadb_send_text),
        RawWay("executemany", _mariadb_executemany, _mariadb_send_many),
    ],
}


async def raw_write(
    database: AsyncEngine, way: RawWay, tables: list[Landed], *, batch_size: int, writers: int
) -> float:
    """Seconds for ``writers`` connections to write every table's rows in batches of
    ``batch_size`` orders, one transaction per batch (its rows of each table)."""
    postgres = database.dialect.name == "postgresql"
    async with database.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        for landed in tables:  # empty, as the drain found them
            await conn.execute(text(f"TRUNCATE TABLE {landed.table.name}"))
        await conn.commit()
        batches = [
            [
                way.prepare(driver, landed, landed.rows[start : start + batch_size])
                for landed in tables
                if landed.rows[start : start + batch_size]
            ]
            for start in range(0, max(len(landed.rows) for landed in tables), batch_size)
        ]
    pending: Iterator[list[Any]] = iter(batches)  # shared: a writer takes the next batch

    async def writer() -> None:
        async with database.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            for batch in pending:
                if postgres:
                    async with driver.transaction():
                        for payload in batch:
                            await way.send(driver, payload)
                else:
                    await driver.begin()
                    for payload in batch:
                        await way.send(driver, payload)
                    await driver.commit()

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(writers):
            group.create_task(writer())
    seconds = time.perf_counter() - started
    async with database.connect() as conn:
        for landed in tables:
            count = (
                await conn.execute(text(f"SELECT COUNT(*) FROM {landed.table.name}"))
            ).scalar_one()
            if count != len(landed.rows):
                sys.exit(f"{way.name}: {count} rows in {landed.table.name}, not {len(landed.rows)}")
    return seconds


# -- the run -------------------------------------------------------------------------------------


async def measure_on(
    database: AsyncEngine, redis: Redis, args: argparse.Namespace
) -> tuple[str, dict[str, Any]]:
    n = args.orders
    product, version = await server_version(database)
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
    await redis.flushall()  # a server measured before left its item's keys under the same id
    scripts = Scripts(redis)
    await scripts.load()
    engine = RedisEngine(
        redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS, prefix=DEFAULT_PREFIX
    )
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
    print(
        f"{product} {version}; backlog: {n} reservations in {backlog_s:.1f} s "
        f"({entries} stream entries)"
    )

    settle_heap(worker=True)  # as a worker process does once it is built
    load = os.getloadavg()[0]
    with profiled(f"drain-{product}", os.getpid(), args):
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
    cpu_us = 1e6 * drained.cpu_seconds / n
    print(
        f"drain   {n} orders, batch {args.batch_size}, {args.persisters} persister(s): "
        f"{drained.seconds:.2f} s, {orders_per_s:,.0f} orders/s"
    )
    print(
        f"        Python CPU {drained.cpu_seconds:.2f} s ({cpu_us:.0f} us per order); load "
        f"average {load:.1f} on {os.cpu_count()} CPUs before the drain"
    )
    print(
        f"        {len(orders)} orders in SQL, stock {sql_stock} matches Redis; entries landed "
        f"per persister: {', '.join(map(str, drained.landed))}"
    )
    for failure in drained.failures:
        print(f"        failed pass (retried): {failure}")

    tables = await landed_rows(database, item_id)
    raw: dict[str, float] = {}
    for way in RAW_WAYS[product]:
        seconds = await raw_write(
            database, way, tables, batch_size=args.batch_size, writers=args.persisters
        )
        raw[way.name] = n / seconds
        print(
            f"raw     {way.name}: {seconds:.2f} s, {n / seconds:,.0f} orders/s "
            f"({sum(len(t.rows) for t in tables) / seconds:,.0f} rows/s)"
        )
    fastest = max(raw, key=raw.__getitem__)
    ratio = orders_per_s / raw[fastest]
    print(f"ratio   {ratio:.3f} (drain / {fastest})")
    return product, {
        "orders_per_s": round(orders_per_s, 1),
        "cpu_us_per_order": round(cpu_us, 1),
        "raw_method": fastest,
        "raw_orders_per_s": round(raw[fastest], 1),
        "raw_rows_per_s": round(raw[fastest] * sum(len(t.rows) for t in tables) / n, 1),
        "ratio": round(ratio, 3),
        "raw_orders_per_s_by_method": {name: round(rate, 1) for name, rate in raw.items()},
        "database": f"{product} {version}",
    }


async def measure(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    pool = BlockingConnectionPool.from_url(
        server.url, decode_responses=True, max_connections=CONCURRENCY
    )
    redis = Redis.from_pool(pool)
    results: dict[str, Any] = {
        "orders": args.orders, "batch_size": args.batch_size, "persisters": args.persisters,
    }  # fmt: skip
    try:
        for server_url in args.database_urls:
            name = f"seckill_bench_{secrets.token_hex(4)}"
            url = await create_database(server_url, name)
            try:
                database = open_database(url, pool_size=max(10, args.persisters + 2))
                try:
                    product, figures = await measure_on(database, redis, args)
                    results[product] = figures
                finally:
                    await database.dispose()
            finally:
                await drop_database(server_url, name)
    finally:
        await redis.aclose()
    return results


def main(argv: list[str] | None = None) -> None:
    run_on_private_redis(measure, parse_args(argv))


if __name__ == "__main__":
    main()
