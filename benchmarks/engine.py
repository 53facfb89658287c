"""Reservation throughput: the Python engine against redis-benchmark, on one private Redis.

Two figures for the same ``reserve.lua`` on the same server, in the same run:

* ``reservations_per_s``: N purchases from distinct buyers through ``RedisEngine.reserve``, called
  as the API calls it: asyncio tasks sharing a pooled ``redis.asyncio`` client, Redis TIME as the
  clock, the input checks, order ids from ``OrderIds``, replies parsed into ``Reservation``.
* ``redis_benchmark_per_s``: the same script (same SHA, same item-shaped keys and arguments) driven
  by ``redis-benchmark`` at the same concurrency. Its client is C and nearly free, so this is about
  what the server itself can do for this script.

``ratio`` is the first over the second. Near 1, Redis is the limit and the Python side costs
little; well below 1, the client's own overhead (event loop, command packing, reply parsing) caps
one API process before Redis does, and the gap says how many API processes one Redis can feed.

The script starts its own redis-server on a free loopback port and throws it away afterwards; it
never touches any other Redis. The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import shutil
import sys
import time
from collections import Counter
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis

from benchmarks.harness import run_on_private_redis
from seckill.domain.holds import Reservation
from seckill.domain.ids import OrderIds
from seckill.domain.items import SaleItem, Stock
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import ItemKeys
from seckill.engine.scripts import ScriptName, Scripts
from seckill.redis_server import RedisServer

PYTHON_ITEM = 1
BENCHMARK_ITEM = 2  # a second item, so the two runs never share a key
TOTAL = 10**9  # never sells out: every request takes the full reservation path
IDEMPOTENCY_TTL_MS = 3_600_000
# redis-benchmark replaces each occurrence of RAND with its own 12-digit zero-padded number
# drawn from random(), so a range above 2**31 - 1 adds nothing.
RAND = "__rand_int__"
RAND_RANGE = 2**31 - 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000, help="reservations per figure")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--connections", type=int, default=64, help="Python client pool size")
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "connections"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def open_item(item_id: int) -> SaleItem:
    """A hot item on sale from a minute ago for the next hour, one unit per buyer."""
    now = int(time.time() * 1000)
    return SaleItem(
        item_id=item_id,
        total=TOTAL,
        starts_at_ms=now - 60_000,
        ends_at_ms=now + 3_600_000,
        per_buyer_limit=1,
        hold_ms=600_000,
    )


async def load(engine: RedisEngine, item_id: int) -> None:
    outcome = await engine.load_item(open_item(item_id))
    if outcome is not Outcome.LOADED:
        sys.exit(f"item {item_id} did not load on a fresh Redis: {outcome}")


async def warm_up(redis: Redis, connections: int) -> None:
    """Open the pool's connections before the clock starts, as redis-benchmark does."""
    await asyncio.gather(*(redis.ping() for _ in range(connections)))


def label(reservation: Reservation) -> str:
    outcome = reservation.outcome.value
    return f"{outcome} (replayed)" if reservation.replayed else outcome


async def reserve_all(
    engine: RedisEngine, *, requests: int, concurrency: int
) -> tuple[float, Counter[str]]:
    """Seconds taken by ``requests`` reservations from distinct buyers, and their outcomes."""
    order_ids = OrderIds(worker_id=1)
    numbers = iter(range(requests))  # shared: a task takes the next buyer as soon as it is free
    outcomes: Counter[str] = Counter()

    async def buyer() -> None:
        for i in numbers:
            reservation = await engine.reserve(
                PYTHON_ITEM,
                buyer=f"b{i}",
                quantity=1,
                idempotency_key=f"k{i}",
                order_id=order_ids.next(),
            )
            outcomes[label(reservation)] += 1

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(buyer())
    return time.perf_counter() - started, outcomes


def check_python_run(outcomes: Counter[str], stock: Stock | None, requests: int) -> None:
    if outcomes != Counter({Outcome.RESERVED.value: requests}):
        sys.exit(f"sanity check failed: expected {requests} fresh reservations, got {outcomes}")
    if stock is None or not stock.balanced or stock.held != requests:
        sys.exit(f"sanity check failed: expected balanced stock with held={requests}, got {stock}")


def benchmark_command(
    binary: str, *, port: int, requests: int, clients: int, sha: str, keys: ItemKeys
) -> list[str]:
    """One EVALSHA of reserve.lua per request, with a fresh buyer, key and order id each time.

    The holds key also gets a RAND suffix: order ids can only come from one RAND (19 digits at
    most), and at 2**31 values some repeat within a few tens of thousands of requests. A repeat
    on the item's own holds hash is a ``duplicate_order_id`` error, and redis-benchmark stops at
    the first error. A per-request holds key keeps the script's work the same, in the same slot.
    The buyer inside the idempotency key name draws its own RAND: any unique name will do.
    """
    buyer = f"b{RAND}"
    script_keys = (
        keys.item,
        keys.buyers,
        f"{keys.holds}:{RAND}",
        keys.deadlines,
        keys.events,
        keys.idempotency(buyer, f"k{RAND}"),
    )
    # reserve.lua ARGV: item id, buyer, quantity, order id, idempotency ttl, now ("" = Redis TIME)
    script_args = (str(BENCHMARK_ITEM), buyer, "1", f"1{RAND}", str(IDEMPOTENCY_TTL_MS), "")
    return [
        binary,
        "-h", "127.0.0.1", "-p", str(port),
        "-c", str(clients), "-n", str(requests), "-r", str(RAND_RANGE), "--csv",
        "EVALSHA", sha, str(len(script_keys)), *script_keys, *script_args,
    ]  # fmt: skip


def requests_per_second(csv_text: str) -> float:
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    if len(rows) != 1 or "rps" not in rows[0]:
        sys.exit(f"cannot read redis-benchmark's CSV output: {csv_text!r}")
    return float(rows[0]["rps"])


async def run_redis_benchmark(command: list[str]) -> float:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        sys.exit(f"redis-benchmark failed ({process.returncode}): {(out + err).decode()[-2000:]}")
    return requests_per_second(out.decode())


async def measure(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    assert server.port is not None
    pool = BlockingConnectionPool.from_url(
        server.url, decode_responses=True, max_connections=args.connections
    )
    redis = Redis.from_pool(pool)
    try:
        version = (await redis.info("server"))["redis_version"]
        scripts = Scripts(redis)
        await scripts.load()
        engine = RedisEngine(redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS)
        print(f"redis-server {version} at {server.url} ({server.binary})")

        await load(engine, PYTHON_ITEM)
        await warm_up(redis, min(args.connections, args.concurrency))
        seconds, outcomes = await reserve_all(
            engine, requests=args.requests, concurrency=args.concurrency
        )
        check_python_run(outcomes, await engine.stock(PYTHON_ITEM), args.requests)
        python_rps = args.requests / seconds
        print(f"python  RedisEngine.reserve: {args.requests} in {seconds:.2f} s")
        print(f"        {python_rps:,.0f} reservations/s, all reserved, stock balanced")

        benchmark = shutil.which("redis-benchmark")
        benchmark_rps = None
        if benchmark is None:
            print("redis-benchmark not on PATH: no server-side figure")
        else:
            await load(engine, BENCHMARK_ITEM)
            command = benchmark_command(
                benchmark,
                port=server.port,
                requests=args.requests,
                clients=args.concurrency,
                sha=scripts[ScriptName.RESERVE].sha,
                keys=engine.keys(BENCHMARK_ITEM),
            )
            benchmark_rps = await run_redis_benchmark(command)
            stock = await engine.stock(BENCHMARK_ITEM)
            held = None if stock is None else stock.held
            print(f"redis-benchmark EVALSHA:     {args.requests} requests, {held} reserved")
            print(f"        {benchmark_rps:,.0f} requests/s")
    finally:
        await redis.aclose()

    ratio = None if benchmark_rps is None else python_rps / benchmark_rps
    if ratio is not None:
        print(f"ratio   {ratio:.2f} (Python engine / redis-benchmark)")
    return {
        "reservations_per_s": round(python_rps, 1),
        "redis_benchmark_per_s": benchmark_rps,
        "ratio": None if ratio is None else round(ratio, 3),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "redis_version": version,
    }


def main(argv: list[str] | None = None) -> None:
    run_on_private_redis(measure, parse_args(argv))


if __name__ == "__main__":
    main()
