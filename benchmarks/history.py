"""History: what the items sold in the past cost a shop that sells one item now.

For each count N of past items (``--past``, default 1, 100 and 1,000), on a fresh throwaway
redis-server and a fresh SQLite database in a temporary directory:

* setup: N items are created in SQL and warmed into Redis (``Ledger.create_item``,
  ``seckill.services.items.warm_item``), each sold ``--orders-per-item`` times
  (``RedisEngine.reserve``, then ``settle_payment`` succeeded: paid holds and a stream of
  events); each sale ends ``--sale-seconds`` after its item was created, and the run waits until
  every one has ended. Then one live item goes on sale, with as many unpaid holds. A
  ``Persister`` lands every stream in SQL: the past is settled; then each past item is archived
  (``Archivist.archive``, its grace waived), unless ``--keep-past`` (as before archiving
  existed).
* ``reaper_ms``: one ``Reaper.run_once()`` pass (nothing is due), the median of ``--passes``;
  ``reaper_cpu_us``: this process's CPU per pass, the mean (a sub-millisecond wall time is
  mostly waiting on the loop and the network); ``reaper_commands``: the Redis commands a pass
  sends (INFO commandstats), the work itself, which noise does not move. Measured, as
  the persister below, on fresh connections in an event loop of its own, as a worker runs.
* ``persister_cpu_pct``: a ``Persister`` run as the workers run it (``run_until_stopped``) in
  this process for ``--persister-seconds`` with nothing to land: this process's CPU seconds
  (``time.process_time()``) over that time, as a share of one core.
* ``scrape_ms``: ``GET /metrics`` of a ``seckill api`` child on the same Redis and SQLite, the
  median of ``--scrapes`` (after one unmeasured).
* ``redis_mb``: ``used_memory`` of ``INFO memory`` after setup, in MiB.

Each row runs in a process of its own. Each figure is also given over the first row's (``x
first``): a shop whose idle cost follows its activity, not its history, reads about 1.0 down
each column.

Separately, for each count of ``--idle-items`` (default 1 and 1,000; 0 skips it): that many
items on sale at once, no traffic, and ``seckill serve`` (the API and every worker in one
process) on its own redis-server and SQLite: its CPU over ``--idle-seconds`` as a share of one
core, beside redis-server's, from ``--idle-warmup`` after it answers (longer than the
reconciler's interval: the first passes, which look at every item, are start-up, and the window
holds the passes of its steady state).

Timings depend on what else the machine runs: the load average is printed before each row. No
figure is asserted. The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import uvloop
from redis.asyncio import Redis

from benchmarks.harness import (
    child_env,
    cpu_spent,
    free_port,
    redis_binary,
    seckill_command,
    seckill_settings,
    serving,
    upgrade_database,
)
from seckill.domain.ids import OrderIds
from seckill.domain.items import NewItem
from seckill.domain.money import Money
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.redis_server import RedisServer
from seckill.services.archive import Archivist
from seckill.services.items import warm_item
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.workers.loop import run_until_stopped
from seckill.workers.persister import Persister, PersisterConfig
from seckill.workers.reaper import Reaper

# The engine checks a charge against the unit price it is given: both nothing here.
UNPRICED = Money(0, "USD")

IDEMPOTENCY_TTL_MS = 3_600_000
HOLD_SECONDS = 3600  # no hold falls due during a run: the reaper's passes find nothing to do
PRICE_CENTS = 100
DRAIN_TIMEOUT_S = 300
COLUMNS = (
    "reaper_ms", "reaper_cpu_us", "reaper_commands", "persister_cpu_pct", "scrape_ms", "redis_mb"
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--past", default="1,100,1000", help="counts of past items, comma-separated (one row each)"
    )
    parser.add_argument("--orders-per-item", type=int, default=3, help="paid orders per past item")
    parser.add_argument(
        "--sale-seconds", type=float, default=2.0,
        help="a past item's sale ends this long after it was created",
    )  # fmt: skip
    parser.add_argument(
        "--keep-past", action="store_true",
        help="leave the past items in Redis instead of archiving them",
    )  # fmt: skip
    parser.add_argument("--passes", type=int, default=2000, help="reaper passes timed")
    parser.add_argument("--one-row", type=int, help=argparse.SUPPRESS)  # a row's own process
    parser.add_argument(
        "--persister-seconds", type=float, default=5.0, help="idle persister measured this long"
    )
    parser.add_argument("--scrapes", type=int, default=20, help="GET /metrics timed")
    parser.add_argument(
        "--idle-items", default="1,1000",
        help="counts of items on sale at once for the idle `seckill serve` figures, "
        "comma-separated (0: skip them)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-seconds", type=float, default=20.0, help="idle `seckill serve` measured this long"
    )
    parser.add_argument(
        "--idle-warmup", type=float, default=12.0,
        help="idle `seckill serve` left unmeasured this long after it answers: its start-up "
        "looks at every item (the fence check, the reconciler's and the reaper's first passes) "
        "are not idle cost",
    )  # fmt: skip
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    try:
        args.past = [int(n) for n in args.past.split(",")]
        args.idle_items = [int(n) for n in args.idle_items.split(",") if int(n)]
    except ValueError:
        parser.error(
            f"--past and --idle-items must be whole numbers, comma-separated: {args.past}, "
            f"{args.idle_items}"
        )
    if not args.past or min(args.past) < 0:
        parser.error("--past needs at least one count, none negative")
    for name in ("orders_per_item", "passes", "scrapes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(n < 0 for n in args.idle_items):
        parser.error("--idle-items must not be negative")
    return args


# -- the stores ----------------------------------------------------------------------------------


class Stores:
    """This process's connections to one run's Redis and SQLite."""

    def __init__(self, redis_url: str, database_url: str) -> None:
        self.redis = Redis.from_url(redis_url, decode_responses=True)
        self.database = open_database(database_url)
        self.ledger = Ledger(self.database)
        self.engine = RedisEngine(
            self.redis,
            scripts=Scripts(self.redis),
            idempotency_ttl_ms=IDEMPOTENCY_TTL_MS,
            prefix=DEFAULT_PREFIX,
        )

    async def close(self) -> None:
        await self.redis.aclose()
        await self.database.dispose()


def with_stores(redis_url: str, database_url: str, work: Callable[[Stores], Awaitable[Any]]) -> Any:
    """``work`` on fresh connections, in an event loop of its own (the children are started
    between loops: ``serving`` runs one to wait for its server)."""

    async def run() -> Any:
        stores = Stores(redis_url, database_url)
        try:
            await stores.engine.scripts.load()
            return await work(stores)
        finally:
            await stores.close()

    return uvloop.run(run())


async def put_on_sale(stores: Stores, *, ends_at: datetime, total: int, name: str) -> int:
    now = datetime.now(UTC)
    item_id = await stores.ledger.create_item(
        NewItem(
            name=name, price_cents=PRICE_CENTS, total=total, starts_at=now - timedelta(minutes=1),
            ends_at=ends_at, per_buyer_limit=1, hold_seconds=HOLD_SECONDS,
        )
    )  # fmt: skip
    outcome = await warm_item(stores.engine, stores.ledger, item_id)
    if outcome is not Outcome.LOADED:
        sys.exit(f"item {item_id} did not load: {outcome}")
    return item_id


async def sell(
    stores: Stores, order_ids: OrderIds, item_id: int, orders: int, *, pay: bool
) -> None:
    for i in range(orders):
        order_id = order_ids.next()
        reserved = await stores.engine.reserve(
            item_id, buyer=f"b{item_id}-{i}", quantity=1, idempotency_key=f"k{item_id}-{i}",
            order_id=order_id,
        )  # fmt: skip
        if reserved.outcome is not Outcome.RESERVED:
            sys.exit(f"item {item_id}: a reservation answered {reserved.outcome}")
        if pay:
            paid = await stores.engine.settle_payment(
                item_id,
                order_id,
                payment_id=f"pay-{order_id}",
                succeeded=True,
                charged=UNPRICED,
                unit_price=UNPRICED,
            )
            if paid.outcome is not Outcome.PAID:
                sys.exit(f"item {item_id}: a payment answered {paid.outcome}")


async def land_everything(stores: Stores) -> int:
    """Run a persister until a pass finds nothing; returns the entries it landed."""
    persister = Persister(
        redis=stores.redis, ledger=stores.ledger, consumer="history-setup",
        config=PersisterConfig(batch_size=1000, block_ms=50),
        prefix=DEFAULT_PREFIX,
    )  # fmt: skip
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    quiet = 0
    while quiet < 2:  # the first pass may only discover the streams
        quiet = quiet + 1 if await persister.run_once() == 0 else 0
        if time.monotonic() > deadline:
            sys.exit(f"the streams did not land in {DRAIN_TIMEOUT_S} s")
    return persister.landed


# -- one row -------------------------------------------------------------------------------------


async def set_up(stores: Stores, args: argparse.Namespace, past: int) -> dict[str, Any]:
    """``past`` ended items, sold and paid; one live item with unpaid holds; all landed."""
    started = time.perf_counter()
    order_ids = OrderIds(worker_id=1)
    last_end = datetime.now(UTC)
    past_ids = []
    for i in range(past):
        last_end = datetime.now(UTC) + timedelta(seconds=args.sale_seconds)
        item_id = await put_on_sale(
            stores, ends_at=last_end, total=args.orders_per_item + 2, name=f"past {i}"
        )
        await sell(stores, order_ids, item_id, args.orders_per_item, pay=True)
        past_ids.append(item_id)
    wait_s = (last_end - datetime.now(UTC)).total_seconds()
    if wait_s > 0:  # every past sale over before anything is measured
        await asyncio.sleep(wait_s + 0.1)
    live = await put_on_sale(
        stores, ends_at=datetime.now(UTC) + timedelta(hours=2), total=1000, name="live"
    )
    await sell(stores, order_ids, live, args.orders_per_item, pay=False)
    landed = await land_everything(stores)
    archiving_s = 0.0
    if not args.keep_past:
        archiving = time.perf_counter()
        archivist = Archivist(engine=stores.engine, ledger=stores.ledger, grace=timedelta(0))
        for item_id in past_ids:
            done = await archivist.archive(item_id)
            if not done.removed:
                sys.exit(f"past item {item_id} was not archived: {done.hindrances}")
        archiving_s = time.perf_counter() - archiving
    registry = await stores.engine.item_count()
    memory = await stores.redis.info("memory")
    return {
        "setup_s": round(time.perf_counter() - started, 1),
        "landed": landed,
        "archiving_s": round(archiving_s, 1),
        "registry": registry,
        "redis_mb": round(int(memory["used_memory"]) / 2**20, 2),
    }


async def reaper_pass(stores: Stores, passes: int) -> tuple[float, float, float]:
    """A pass's median wall time (ms), this process's mean CPU per pass (us) and the Redis
    commands a pass sends (the work itself, which no noise moves)."""
    reaper = Reaper(engine=stores.engine)
    await reaper.run_once()  # unmeasured: the first pass learns each item's shard count
    times = []
    commands = await redis_commands(stores.redis)
    cpu = time.process_time()
    for _ in range(passes):
        started = time.perf_counter()
        released = await reaper.run_once()
        times.append((time.perf_counter() - started) * 1000)
        if released:
            sys.exit(f"the reaper released {released} holds: none should be due")
    cpu_us = (time.process_time() - cpu) / passes * 1e6
    sent = (await redis_commands(stores.redis) - commands - 1) / passes  # less one INFO
    return statistics.median(times), cpu_us, sent


async def redis_commands(redis: Redis) -> int:
    """Commands the server has run so far (INFO commandstats)."""
    stats = await redis.info("commandstats")
    return sum(int(stat["calls"]) for stat in stats.values())


async def persister_idle_cpu(stores: Stores, seconds: float) -> float:
    """This process's CPU share while a persister runs idle, as the workers run it."""
    stop = asyncio.Event()
    persister = Persister(
        redis=stores.redis,
        ledger=stores.ledger,
        consumer="history",
        stop=stop,
        prefix=DEFAULT_PREFIX,
    )
    task = asyncio.create_task(run_until_stopped(persister, stop))
    try:
        await asyncio.sleep(1.0)  # unmeasured: discovery, the group's first reads
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    finally:
        stop.set()
        await task
    if persister.landed:
        sys.exit(f"the idle persister landed {persister.landed} entries: none were waiting")
    return share


async def scrape_ms(url: str, scrapes: int) -> float:
    times = []
    async with aiohttp.ClientSession() as http:
        for i in range(scrapes + 1):
            started = time.perf_counter()
            async with http.get(f"{url}/metrics") as reply:
                await reply.read()
                if reply.status != 200:
                    sys.exit(f"GET /metrics answered {reply.status}")
            if i:  # the first is unmeasured
                times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


class Deployment(NamedTuple):
    """A throwaway deployment: its own redis-server, a migrated SQLite file, a work directory
    and the environment of a ``seckill`` child on them."""

    workdir: Path
    redis: RedisServer
    database_url: str
    env: dict[str, str]


@contextlib.contextmanager
def deployment(args: argparse.Namespace) -> Iterator[Deployment]:
    with (
        tempfile.TemporaryDirectory(prefix="seckill-history-") as tmp,
        RedisServer(binary=redis_binary(args.redis_server), port=free_port()) as redis,
    ):
        workdir = Path(tmp)
        database_url = f"sqlite+aiosqlite:///{workdir / 'seckill.db'}"
        env = child_env(
            seckill_settings(
                workdir / "seckill", redis_url=redis.url, database_url=database_url, concurrency=8
            )
        )
        upgrade_database(env, workdir)
        yield Deployment(workdir, redis, database_url, env)


def measure_row(args: argparse.Namespace, past: int) -> dict[str, Any]:
    with deployment(args) as (workdir, redis, database_url, env):

        async def as_a_worker(stores: Stores) -> dict[str, Any]:
            wall_ms, cpu_us, commands = await reaper_pass(stores, args.passes)
            persister = 100 * await persister_idle_cpu(stores, args.persister_seconds)
            return {
                "reaper_ms": wall_ms, "reaper_cpu_us": cpu_us, "reaper_commands": commands,
                "persister_cpu_pct": persister,
            }  # fmt: skip

        row: dict[str, Any] = with_stores(
            redis.url, database_url, lambda stores: set_up(stores, args, past)
        )
        # Measured on fresh connections in a loop of their own, as a worker process runs.
        row |= with_stores(redis.url, database_url, as_a_worker)
        port = free_port()
        api_argv = seckill_command("api", "--host", "127.0.0.1", "--port", str(port))
        with serving(api_argv, port=port, env=env, cwd=workdir, log=workdir / "api.log"):
            row["scrape_ms"] = uvloop.run(scrape_ms(f"http://127.0.0.1:{port}", args.scrapes))
    return row


# -- idle serve ----------------------------------------------------------------------------------


def measure_idle_serve(args: argparse.Namespace, items: int) -> dict[str, Any]:
    with deployment(args) as (workdir, redis, database_url, env):

        async def on_sale(stores: Stores) -> int:
            ends_at = datetime.now(UTC) + timedelta(hours=2)
            for i in range(items):
                await put_on_sale(stores, ends_at=ends_at, total=100, name=f"on sale {i}")
            return await stores.engine.item_count()

        registry = with_stores(redis.url, database_url, on_sale)
        port = free_port()
        argv = seckill_command("serve", "--host", "127.0.0.1", "--port", str(port))
        with serving(argv, port=port, env=env, cwd=workdir, log=workdir / "serve.log") as serve:
            time.sleep(args.idle_warmup)  # unmeasured: start-up, the first look at every item
            pids = {"serve": serve.pid, "redis": redis.process.pid if redis.process else None}
            wall = time.perf_counter()
            with cpu_spent(pids) as spent:
                time.sleep(args.idle_seconds)
            wall = time.perf_counter() - wall
    return {
        "items_on_sale": items,
        "registry": registry,
        "seconds": round(wall, 1),
        "serve_cpu_pct": round(100 * spent["serve"] / wall, 1),
        "redis_cpu_pct": round(100 * spent["redis"] / wall, 1),
    }


# -- the run -------------------------------------------------------------------------------------


def measure_row_apart(argv: list[str], past: int) -> dict[str, Any]:
    """One row in a process of its own: what an earlier row left in this one (its heap, its
    loop's leftovers) moved the sub-millisecond figures more than history did."""
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.history", *argv, "--one-row", str(past)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    row: dict[str, Any] = json.loads(child.stdout.splitlines()[-1])
    return row


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.one_row is not None:
        print(json.dumps(measure_row(args, args.one_row)))
        return
    fate = "kept" if args.keep_past else "archived"
    print(
        f"past items {', '.join(map(str, args.past))} ({fate}); "
        f"{args.orders_per_item} paid orders each; one live item; {os.cpu_count()} CPUs",
        flush=True,
    )
    rows: dict[int, dict[str, Any]] = {}
    for past in args.past:
        load = os.getloadavg()[0]
        row = measure_row_apart(argv or sys.argv[1:], past)
        row["load_before"] = round(load, 2)
        rows[past] = row
        kept = "kept in Redis" if args.keep_past else f"archived in {row['archiving_s']} s"
        print(
            f"  {past} past: setup {row['setup_s']} s, {row['landed']} entries landed, {kept}, "
            f"{row['registry']} items in the registry, load average {load:.1f} before",
            flush=True,
        )
    first = rows[args.past[0]]
    ratios = {
        past: {c: round(row[c] / first[c], 2) if first[c] else None for c in COLUMNS}
        for past, row in rows.items()
    }
    print()
    print(
        f"{'past items':>10}  {'reaper pass ms':>14}  {'CPU us':>6}  {'commands':>8}  "
        f"{'persister idle CPU %':>20}  {'scrape ms':>9}  {'Redis MB':>8}   "
        "x first: reaper  CPU  commands  persister  scrape  Redis"
    )
    for past, row in rows.items():
        r = ratios[past]
        print(
            f"{past:>10}  {row['reaper_ms']:>14.2f}  {row['reaper_cpu_us']:>6.0f}  "
            f"{row['reaper_commands']:>8.1f}  {row['persister_cpu_pct']:>20.1f}  "
            f"{row['scrape_ms']:>9.1f}  {row['redis_mb']:>8.2f}   "
            f"{_ratio(r['reaper_ms']):>15}  {_ratio(r['reaper_cpu_us']):>4}  "
            f"{_ratio(r['reaper_commands']):>8}  {_ratio(r['persister_cpu_pct']):>9}  "
            f"{_ratio(r['scrape_ms']):>6}  {_ratio(r['redis_mb']):>5}"
        )
    idle = []
    for items in args.idle_items:
        found = measure_idle_serve(args, items)
        idle.append(found)
        print(
            f"\nidle `seckill serve`, {found['items_on_sale']} items on sale, no traffic, "
            f"{found['seconds']} s: {found['serve_cpu_pct']}% of a core "
            f"(redis-server {found['redis_cpu_pct']}%)"
        )
    result = {
        "past": {
            str(past): {
                "reaper_ms": round(row["reaper_ms"], 3),
                "reaper_cpu_us": round(row["reaper_cpu_us"], 1),
                "reaper_commands": round(row["reaper_commands"], 2),
                "persister_cpu_pct": round(row["persister_cpu_pct"], 2),
                "scrape_ms": round(row["scrape_ms"], 2),
                "redis_mb": row["redis_mb"],
                "registry": row["registry"],
                "setup_s": row["setup_s"],
                "load_before": row["load_before"],
            }
            for past, row in rows.items()
        },
        "x_first": {str(past): r for past, r in ratios.items()},
        "idle_serve": idle,
        "past_archived": not args.keep_past,
        "orders_per_item": args.orders_per_item,
        "passes": args.passes,
        "persister_seconds": args.persister_seconds,
        "scrapes": args.scrapes,
    }
    print(json.dumps(result))


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
