"""seckill against the naive SQL strategies: the same crowd on one hot item, one run, audited.

Three servers, one after the other, each sent the same crowd over HTTP:

* ``rowlock``: ``SELECT ... FOR UPDATE`` on the item's row, then UPDATE and INSERT, one
  transaction (``baselines.py``).
* ``conditional``: ``UPDATE ... WHERE stock >= q``, then INSERT, one transaction
  (``baselines.py``).
* ``seckill``: the product as it runs: ``seckill serve`` (the API with its persister, reaper and
  reconciler in one process) over its own redis-server (AOF on, ``appendfsync everysec``: the
  product's default) and its own MariaDB database.

The baselines are here as yardsticks, not product code: each is written correctly (no oversell,
the per-buyer limit and idempotency keys kept inside its transaction, deadlocks retried) and
served the way seckill is: FastAPI on uvicorn on uvloop, one process, the same bearer tokens,
bodies and errors, a pool of SQL connections as large as the crowd's concurrency (64 at most).
seckill's purchases also carry a purchase ticket, fetched before the clock starts.

The crowd: N buyers (default 5,000) race for one item of U units (default 100), at most one per
buyer, from C concurrent keep-alive connections (default 64) of the product's own client
(``seckill.crowd.client``, one aiohttp session). Each buyer sends one purchase (quantity 1, its
own idempotency key); one buyer in ten sends it again with the same key once answered, as a
client that retries does, and must get the same answer. Tokens are minted before the timed part;
each server is warmed up first with a few purchases of another
item. Only the purchase requests are timed.

How to read it: ``req/s`` is purchase requests answered over the wall time of the timed part;
p50/p99 are per request latencies at the client. With many more buyers than units most of the
crowd is refused (409 ``sold_out``), as in a real flash sale, so what a refusal costs weighs
most; ``--units`` near ``--buyers`` measures the selling path instead. The ``cpu`` line says
where the time went: CPU seconds, over the timed part, of the server process, the store behind
it (redis-server or mariadbd, when local) and the client. A server near one CPU second per
second of wall time is limited by its own Python process; one well below it waits on something
else (for the baselines, the item's row lock: the ``innodb_row_lock_*`` line, server-wide
counters, so other work on the same MariaDB shows up in them). Client, servers and database
share this one machine: a figure is this machine's, and noisy when it is busy.

The audit, after each run (seckill's once its stream has drained into SQL): from the SQL rows,
units sold against the total (``oversold``), stock below zero, stock + units ordered == total
(``balanced``), duplicate orders (two rows for one buyer and key, or more units for one buyer
than the limit), orders answered 202 but missing in SQL (``lost``), rows no 202 announced
(``unannounced``: a request whose answer the client never got) and repeats answered differently
from the first time. With more buyers than units and every request answered, ``stock_left``
is 0.

Needs a MariaDB (``--mariadb-url``, default ``$SECKILL_TEST_MARIADB_URL``, else
root@127.0.0.1:3306). The databases ``seckill_compare_<strategy>`` are dropped and created afresh
and dropped again at the end (``--keep-databases`` leaves them for a look). The servers listen on
free loopback ports and are stopped at the end, also on an error or Ctrl-C. The last line printed
is one JSON object; the exit code is 1 if an audit is not clean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks.baselines import Strategy, add_item, create_schema
from benchmarks.harness import (
    Buyer,
    api,
    child_env,
    cpu_spent,
    create_item,
    credentials,
    drained,
    durable_redis,
    fetch_tickets,
    free_port,
    local_database_pid,
    log_tail,
    make_crowd,
    seckill_command,
    seckill_settings,
    server_settings,
    serving,
    status_key,
    upgrade_database,
)
from seckill.crowd.client import ApiClient, Credentials
from seckill.store.database import create_database, drop_database

DEFAULT_URL = "mysql+asyncmy://root@127.0.0.1:3306/test"
STRATEGIES = ("rowlock", "conditional", "seckill")
MAIN_ITEM, WARM_ITEM = 1, 2  # the baselines' item ids (seckill assigns its own)
DRAIN_TIMEOUT_S = 120


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buyers", type=int, default=5_000, help="buyers in the crowd")
    parser.add_argument("--concurrency", type=int, default=64, help="connections in flight")
    parser.add_argument("--units", type=int, default=100, help="units of the hot item")
    parser.add_argument(
        "--repeat-share", type=float, default=0.1,
        help="share of buyers who send their purchase again with the same key",
    )  # fmt: skip
    parser.add_argument(
        "--warm-up", type=int, default=128, help="purchases of another item before the clock"
    )
    parser.add_argument(
        "--mariadb-url",
        default=os.environ.get("SECKILL_TEST_MARIADB_URL") or DEFAULT_URL,
        help="MariaDB server (SQLAlchemy asyncmy URL); its databases seckill_compare_* are "
        "created afresh (default: $SECKILL_TEST_MARIADB_URL, else %(default)s)",
    )
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the databases for a look"
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("buyers", "concurrency", "units", "warm_up"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.repeat_share <= 1:
        parser.error("--repeat-share must be between 0 and 1")
    return args


# -- the crowd -----------------------------------------------------------------------------------


@dataclass
class Run:
    """What the client saw of one strategy's timed part."""

    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)  # answered requests
    statuses: Counter[str] = field(default_factory=Counter)  # "202", "409 sold_out", ...
    accepted: set[str] = field(default_factory=set)  # order ids answered 202
    repeat_mismatches: int = 0
    last_sale_s: float = 0.0  # from the start until the last new order was answered
    cpu: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def answered(self) -> int:
        return len(self.latencies_ms)

    @property
    def per_second(self) -> float:
        return self.answered / self.seconds if self.seconds else 0.0

    def percentile(self, p: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else 0.0
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[p - 1]

    def count(self, status: str) -> int:
        return sum(n for s, n in self.statuses.items() if s.split()[0] == status)

    def others(self) -> str:
        rest = {s: n for s, n in self.statuses.items() if s.split()[0] not in {"202", "409"}}
        return ", ".join(f"{s}: {n}" for s, n in sorted(rest.items())) or "-"


def crowd_limits(args: argparse.Namespace) -> dict[str, object]:
    """What every server is told beside its secrets: limits the crowd stays within."""
    # The crowd keeps `concurrency` purchases in flight: none may be shed for that.
    return {"admission_max_in_flight": max(512, 2 * args.concurrency)}


async def buy_all(client: ApiClient, item_id: int, crowd: list[Buyer], concurrency: int) -> Run:
    """Every buyer's purchase (and repeat), ``concurrency`` at a time, each one timed."""
    run = Run()
    turns = iter(crowd)  # shared: a connection takes the next buyer once free

    async def once(buyer: Buyer) -> tuple[int, str | None]:
        reply = await client.buy(item_id, buyer.name, ticket=buyer.ticket, key=buyer.key,
                                 quantity=1)  # fmt: skip
        run.statuses[status_key(reply)] += 1
        if reply.status == 0:
            return 0, None
        run.latencies_ms.append(reply.ms)
        order_id = str(reply.body["order_id"]) if reply.status == 202 else None
        if order_id is not None and order_id not in run.accepted:
            run.accepted.add(order_id)
            run.last_sale_s = time.perf_counter() - started
        return reply.status, order_id

    async def connection() -> None:
        for buyer in turns:
            first = await once(buyer)
            if buyer.repeats and await once(buyer) != first:
                run.repeat_mismatches += 1

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(connection())
    run.seconds = time.perf_counter() - started
    return run


async def warm_up(client: ApiClient, item_id: int, buyers: list[Buyer], concurrency: int) -> None:
    """Purchases of another item: connections opened, pools filled, code paths run once."""
    run = await buy_all(client, item_id, buyers, concurrency)
    if run.statuses != Counter({"202": len(buyers)}):
        sys.exit(f"warm-up: expected {len(buyers)} accepted purchases, got {dict(run.statuses)}")


async def timed(
    client: ApiClient,
    item_id: int,
    crowd: list[Buyer],
    concurrency: int,
    pids: Mapping[str, int | None],
) -> Run:
    """The timed part, with the CPU each process (and this client) spent over it."""
    with cpu_spent(pids, own="client") as spent:
        run = await buy_all(client, item_id, crowd, concurrency)
    run.cpu = spent
    return run


# -- the database --------------------------------------------------------------------------------


async def fresh_database(server_url: str, name: str) -> str:
    await drop_database(server_url, name)
    return await create_database(server_url, name)


async def lock_status(engine: AsyncEngine) -> dict[str, int]:
    """InnoDB's server-wide row-lock and deadlock counters."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SHOW GLOBAL STATUS WHERE Variable_name IN "
                 "('Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_deadlocks')")
        )  # fmt: skip
        return {str(name).lower(): int(value) for name, value in rows}


async def server_facts(url: str) -> str:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            version = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
            flush = (
                await conn.execute(text("SELECT @@innodb_flush_log_at_trx_commit"))
            ).scalar_one()
        return f"MariaDB {version.split('-')[0]}, innodb_flush_log_at_trx_commit={flush}"
    finally:
        await engine.dispose()


def audit(
    *,
    total: int,
    stock: int,
    rows: Sequence[tuple[int, str, str | None, int]],  # order id, buyer, key (if kept), units
    limit: int,
    run: Run,
) -> dict[str, Any]:
    """What the SQL rows say, checked against what the API answered."""
    sold = sum(units for *_, units in rows)
    per_buyer: Counter[str] = Counter()
    per_key: Counter[tuple[str, str]] = Counter()
    for _, buyer, key, units in rows:
        per_buyer[buyer] += units
        if key is not None:
            per_key[(buyer, key)] += 1
    duplicates = sum(n - 1 for n in per_key.values()) + sum(
        units - limit for units in per_buyer.values() if units > limit
    )
    in_sql = {str(order_id) for order_id, *_ in rows}
    result = {
        "total": total,
        "sold": sold,
        "stock_left": stock,
        "oversold": max(0, sold - total),
        "negative_stock": stock < 0,
        "balanced": stock + sold == total,
        "duplicates": duplicates,
        "lost": len(run.accepted - in_sql),
        "unannounced": len(in_sql - run.accepted),
        "repeat_mismatches": run.repeat_mismatches,
    }
    result["clean"] = (
        result["oversold"] == 0
        and not result["negative_stock"]
        and result["balanced"]
        and duplicates == 0
        and result["lost"] == 0
        and run.repeat_mismatches == 0
    )
    return result


# -- the baselines -------------------------------------------------------------------------------


def run_baseline(
    strategy: Strategy, args: argparse.Namespace, who: Credentials, crowd: list[Buyer],
    warmers: list[Buyer], workdir: Path,
) -> tuple[Run, dict[str, Any]]:  # fmt: skip
    name = f"seckill_compare_{strategy.value}"
    url = uvloop.run(fresh_database(args.mariadb_url, name))
    try:
        uvloop.run(create_schema(url))
        uvloop.run(add_item(url, item_id=MAIN_ITEM, total=args.units, per_buyer_limit=1))
        uvloop.run(add_item(url, item_id=WARM_ITEM, total=len(warmers), per_buyer_limit=1))
        port, log = free_port(), workdir / f"{strategy.value}.log"
        argv = [
            sys.executable, "-m", "benchmarks.baselines", "--strategy", strategy.value,
            "--database-url", url, "--port", str(port),
            "--pool-size", str(min(args.concurrency, 64)),
        ]  # fmt: skip
        env = child_env(server_settings(workdir / strategy.value) | crowd_limits(args))
        with serving(argv, port=port, env=env, cwd=workdir, log=log) as process:
            pids = {"server": process.pid, "mariadb": local_database_pid(args.mariadb_url)}
            run = uvloop.run(drive_baseline(args, who, crowd, warmers, port, pids))
        if process.returncode not in (0, -signal.SIGTERM):
            print(f"{strategy.value}: the server exited with {process.returncode}:\n"
                  f"{log_tail(log)}")  # fmt: skip
        found = uvloop.run(read_baseline(url))
        return run, audit(**found, limit=1, run=run)
    finally:
        if not args.keep_databases:
            uvloop.run(drop_database(args.mariadb_url, name))


async def drive_baseline(
    args: argparse.Namespace, who: Credentials, crowd: list[Buyer], warmers: list[Buyer],
    port: int, pids: Mapping[str, int | None],
) -> Run:  # fmt: skip
    status_engine = create_async_engine(args.mariadb_url, pool_size=1)
    try:
        async with api(f"http://127.0.0.1:{port}", who, args.concurrency) as client:
            await warm_up(client, WARM_ITEM, warmers, args.concurrency)
            locks_before = await lock_status(status_engine)
            run = await timed(client, MAIN_ITEM, crowd, args.concurrency, pids)
            locks_after = await lock_status(status_engine)
            health = (await client.health()).body
    finally:
        await status_engine.dispose()
    run.notes = {name: locks_after[name] - locks_before[name] for name in locks_before}
    run.notes |= {"lock_retries": health["retries"], "gave_up": health["gave_up"]}
    return run


_BASELINE_ORDERS = text(
    "SELECT id, buyer, idempotency_key, quantity FROM orders WHERE item_id = :i"
)


async def read_baseline(url: str) -> dict[str, Any]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            total, stock = (
                await conn.execute(
                    text("SELECT total, stock FROM items WHERE item_id = :i"), {"i": MAIN_ITEM}
                )
            ).one()
            rows = (await conn.execute(_BASELINE_ORDERS, {"i": MAIN_ITEM})).all()
    finally:
        await engine.dispose()
    return {"total": total, "stock": stock, "rows": [tuple(row) for row in rows]}


# -- seckill -------------------------------------------------------------------------------------


def run_seckill(
    args: argparse.Namespace, who: Credentials, crowd: list[Buyer], warmers: list[Buyer],
    workdir: Path,
) -> tuple[Run, dict[str, Any]]:  # fmt: skip
    name = "seckill_compare_seckill"
    url = uvloop.run(fresh_database(args.mariadb_url, name))
    try:
        with durable_redis(args.redis_server, workdir / "redis") as redis:
            settings = seckill_settings(
                workdir / "seckill", redis_url=redis.url, database_url=url,
                concurrency=args.concurrency,
            )  # fmt: skip
            env = child_env(settings | crowd_limits(args))
            upgrade_database(env, workdir)
            port, log = free_port(), workdir / "seckill.log"
            argv = seckill_command("serve", "--host", "127.0.0.1", "--port", str(port))
            with serving(argv, port=port, env=env, cwd=workdir, log=log) as process:
                assert redis.process is not None
                pids = {"server": process.pid, "redis": redis.process.pid}
                run, item_id = uvloop.run(drive_seckill(args, who, crowd, warmers, port, pids))
        found = uvloop.run(read_seckill(url, item_id))
        return run, audit(**found, limit=1, run=run)
    finally:
        if not args.keep_databases:
            uvloop.run(drop_database(args.mariadb_url, name))


async def drive_seckill(
    args: argparse.Namespace, who: Credentials, crowd: list[Buyer], warmers: list[Buyer],
    port: int, pids: Mapping[str, int | None],
) -> tuple[Run, int]:  # fmt: skip
    async with api(f"http://127.0.0.1:{port}", who, args.concurrency) as client:
        item_id = await create_item(client, total=args.units)
        warm_item = await create_item(client, total=len(warmers))
        await fetch_tickets(client, warm_item, warmers, args.concurrency)
        await fetch_tickets(client, item_id, crowd, args.concurrency)
        await warm_up(client, warm_item, warmers, args.concurrency)
        run = await timed(client, item_id, crowd, args.concurrency, pids)
        started = time.perf_counter()
        await drained(client, item_id, DRAIN_TIMEOUT_S)
        run.notes = {"drained_after_s": round(time.perf_counter() - started, 2)}
    return run, item_id


_SECKILL_ORDERS = text(
    "SELECT id, buyer, quantity FROM orders WHERE item_id = :i AND status IN ('held', 'paid')"
)


async def read_seckill(url: str, item_id: int) -> dict[str, Any]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            total, available = (
                await conn.execute(
                    text("SELECT total, available FROM inventory WHERE item_id = :i"),
                    {"i": item_id},
                )
            ).one()
            # Held or paid orders hold units; seckill keeps no idempotency key in SQL (a
            # repeated key is checked through the answers instead).
            rows = (await conn.execute(_SECKILL_ORDERS, {"i": item_id})).all()
    finally:
        await engine.dispose()
    return {
        "total": total,
        "stock": available,
        "rows": [(order_id, buyer, None, quantity) for order_id, buyer, quantity in rows],
    }


# -- the report ----------------------------------------------------------------------------------


def report(results: dict[str, tuple[Run, dict[str, Any]]]) -> None:
    print(
        f"{'strategy':<12} {'requests':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'202':>5} {'409':>6}  other"
    )
    for name, (run, _) in results.items():
        print(
            f"{name:<12} {sum(run.statuses.values()):>8} {run.per_second:>9,.0f} "
            f"{run.percentile(50):>8.2f} {run.percentile(99):>8.2f} {run.count('202'):>5} "
            f"{run.count('409'):>6}  {run.others()}"
        )
    for name, (run, found) in results.items():
        verdict = "clean" if found["clean"] else "NOT CLEAN"
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items())
        print(f"\n{name}: audit {verdict}: sold {found['sold']} of {found['total']}, "
              f"stock left {found['stock_left']}, oversold {found['oversold']}, "
              f"duplicates {found['duplicates']}, lost {found['lost']}, "
              f"unannounced {found['unannounced']}, balanced {found['balanced']}, "
              f"repeats answered differently {found['repeat_mismatches']}")  # fmt: skip
        print(f"  timed part {run.seconds:.2f} s, last unit sold at {run.last_sale_s:.2f} s; "
              f"CPU seconds over it: {cpu}")  # fmt: skip
        print(f"  answers: {', '.join(f'{s}: {n}' for s, n in sorted(run.statuses.items()))}")
        if run.notes:
            print(f"  {', '.join(f'{k} {v}' for k, v in run.notes.items())}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # MariaDB notes a DROP DATABASE IF EXISTS of nothing, and asyncmy logs every note.
    logging.getLogger("asyncmy").setLevel(logging.ERROR)
    results: dict[str, tuple[Run, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="seckill-compare-") as tmp:
        workdir = Path(tmp)
        who = credentials()
        crowd = make_crowd(who, "b", args.buyers, args.repeat_share)
        repeats = sum(buyer.repeats for buyer in crowd)
        facts = uvloop.run(server_facts(args.mariadb_url))
        print(f"{args.buyers} buyers ({repeats} send twice) for {args.units} units, "
              f"{args.concurrency} connections; {facts}; {os.cpu_count()} CPUs")  # fmt: skip
        for strategy in (Strategy.ROWLOCK, Strategy.CONDITIONAL):
            warmers = make_crowd(who, f"w{strategy.value}-", args.warm_up)
            results[strategy.value] = run_baseline(strategy, args, who, crowd, warmers, workdir)
            print(f"{strategy.value}: done, {results[strategy.value][0].per_second:,.0f} req/s")
        warmers = make_crowd(who, "wseckill-", args.warm_up)
        results["seckill"] = run_seckill(args, who, crowd, warmers, workdir)
        print(f"seckill: done, {results['seckill'][0].per_second:,.0f} req/s\n")
    report(results)

    runs = {name: run for name, (run, _) in results.items()}
    summary: dict[str, Any] = {}
    for name in STRATEGIES:
        summary[f"{name}_rps"] = round(runs[name].per_second, 1)
    for name in STRATEGIES:
        summary[f"{name}_p50_ms"] = round(runs[name].percentile(50), 2)
        summary[f"{name}_p99_ms"] = round(runs[name].percentile(99), 2)
    for name in STRATEGIES[:2]:
        ratio = runs["seckill"].per_second / runs[name].per_second if runs[name].seconds else 0
        summary[f"ratio_seckill_{name}"] = round(ratio, 2)
    summary |= {
        "audit": {name: found for name, (_, found) in results.items()},
        "buyers": args.buyers,
        "concurrency": args.concurrency,
        "units": args.units,
        "requests": sum(runs["seckill"].statuses.values()),
    }
    print(json.dumps(summary))
    if not all(found["clean"] for _, found in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # The servers and databases were cleaned up on the way out.
        sys.exit("interrupted")
