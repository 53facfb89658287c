"""Reservation throughput: reserve.lua against its previous version, and the Python engine
against reserve.lua, on one private Redis, in one run.

Each round measures, every figure on a freshly emptied server:

* ``redis-benchmark`` of reserve.lua as it is now, and as it was at ``--before`` (a git
  revision, read with ``git show``; skipped if git cannot give it): one EVALSHA per request with
  the same keys and arguments, ``--concurrency`` clients. Its client is C and nearly free, so this
  is what the server can do for the script. With each: Redis's CPU per call (INFO cpu, the
  request's networking included) and the time inside the script (INFO commandstats, which on
  Redis 7 also times each command the script calls: the rest is Lua and the calls' glue).
* ``RedisEngine.reserve`` as the API calls it: through the ``Pipeliner`` bootstrap wires, on a
  uvloop loop, ``--concurrency`` coroutines buying for distinct buyers with Redis TIME as the
  clock, the input checks, order ids from ``OrderIds`` and replies parsed into ``Reservation``;
  with the CPU the Python process and Redis each spent per reservation.

The best of ``--rounds`` rounds is kept for each figure: other processes on the machine can only
slow a round down. ``speedup`` is today's script over the previous one in redis-benchmark;
``ratio`` the Python engine over redis-benchmark of today's script. Near 1, Redis is the limit
and the Python side costs little; well below, one API process tops out before Redis does.

The script starts its own redis-server on a free loopback port and throws it away afterwards; it
never touches any other Redis. The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import uvloop
from redis.asyncio import Redis

from benchmarks.harness import ROOT, free_port, redis_binary
from seckill.domain.holds import Reservation
from seckill.domain.ids import OrderIds
from seckill.domain.items import SaleItem, Stock
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, ItemKeys
from seckill.engine.pipelining import DEFAULT_CONNECTIONS, Pipeliner
from seckill.engine.scripts import ScriptName, Scripts
from seckill.redis_server import RedisServer

PYTHON_ITEM = 1
BENCHMARK_ITEM = 2  # a second item, so the two kinds of run never share a key
TOTAL = 10**9  # never sells out: every request takes the full reservation path
IDEMPOTENCY_TTL_MS = 3_600_000
# The commit before the reserve script was reworked for speed (see docs/benchmarks.md).
BEFORE = "c3fbf8e"
# redis-benchmark replaces each occurrence of RAND with its own 12-digit zero-padded number
# drawn from random(), so a range above 2**31 - 1 adds nothing.
RAND = "__rand_int__"
RAND_RANGE = 2**31 - 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="reservations per figure")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each figure's best is kept")
    parser.add_argument(
        "--connections", type=int, default=DEFAULT_CONNECTIONS, help="the pipeliner's connections"
    )
    parser.add_argument(
        "--before", default=BEFORE, help="git revision whose reserve.lua is measured beside today's"
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "rounds", "connections"):
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


def script_before(revision: str) -> str | None:
    """reserve.lua as Redis received it at ``revision`` (_common.lua, then the script), or None
    if git cannot show it."""
    texts = []
    for name in ("_common", "reserve"):
        shown = subprocess.run(
            ["git", "show", f"{revision}:src/seckill/engine/lua/{name}.lua"],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        if shown.returncode != 0:
            return None
        texts.append(shown.stdout)
    return "".join(texts)


# -- what Redis spent ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedisCost:
    """Redis's CPU over a run, per call, in µs: all of it (networking included), inside the
    script, and inside the commands the script called (Redis 7 times those; 0 on 6.2)."""

    cpu_us: float
    script_us: float
    commands_us: float

    def __str__(self) -> str:
        split = ""
        if self.commands_us:
            lua = self.script_us - self.commands_us
            split = f" (its commands {self.commands_us:.1f}, Lua and glue {lua:.1f})"
        return f"Redis CPU {self.cpu_us:.1f} µs/call, {self.script_us:.1f} in the script{split}"


async def redis_cpu_s(redis: Redis) -> float:
    cpu = await redis.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def redis_cost(redis: Redis, cpu_before: float, calls: int) -> RedisCost:
    """Since ``cpu_before`` (and the last CONFIG RESETSTAT): what ``calls`` calls cost Redis."""
    cpu = await redis_cpu_s(redis) - cpu_before
    stats = await redis.info("commandstats")
    scripts = stats.get("cmdstat_evalsha", {}).get("usec", 0)
    commands = sum(
        int(stat["usec"])
        for name, stat in stats.items()
        if name not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config|resetstat")
    )
    return RedisCost(cpu * 1e6 / calls, int(scripts) / calls, commands / calls)


async def fresh(redis: Redis) -> None:
    """An empty keyspace and zeroed command stats: each figure starts from the same state."""
    await redis.flushall()
    await redis.config_resetstat()


# -- redis-benchmark -----------------------------------------------------------------------------


def benchmark_command(
    binary: str, *, port: int, requests: int, clients: int, sha: str, keys: ItemKeys
) -> list[str]:
    """One EVALSHA of reserve.lua per request, with a fresh buyer, key and order id each time:
    the keys and arguments ``RedisEngine.reserve`` sends without a rate limit or request id.

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


@dataclass(frozen=True, slots=True)
class ScriptRun:
    calls_per_s: float
    cost: RedisCost


async def benchmark_script(
    engine: RedisEngine, binary: str, port: int, sha: str, args: argparse.Namespace
) -> ScriptRun:
    redis = engine.redis
    await fresh(redis)
    await load(engine, BENCHMARK_ITEM)
    command = benchmark_command(
        binary, port=port, requests=args.requests, clients=args.concurrency, sha=sha,
        keys=engine.keys(BENCHMARK_ITEM),
    )  # fmt: skip
    await redis.config_resetstat()
    cpu_before = await redis_cpu_s(redis)
    calls_per_s = await run_redis_benchmark(command)
    cost = await redis_cost(redis, cpu_before, args.requests)
    stock = await engine.stock(BENCHMARK_ITEM)
    # A RAND can repeat a buyer's idempotency key: that request is answered as a replay.
    if stock is None or not stock.balanced or stock.held < args.requests * 0.99:
        sys.exit(f"sanity check failed: redis-benchmark reserved too little: {stock}")
    return ScriptRun(calls_per_s, cost)


# -- the Python engine ---------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class EngineRun:
    reservations_per_s: float
    python_cpu_us: float  # this process's CPU per reservation
    cost: RedisCost


async def benchmark_engine(engine: RedisEngine, args: argparse.Namespace) -> EngineRun:
    redis = engine.redis
    await fresh(redis)
    await load(engine, PYTHON_ITEM)
    await redis.config_resetstat()
    cpu_before, python_before = await redis_cpu_s(redis), time.process_time()
    seconds, outcomes = await reserve_all(
        engine, requests=args.requests, concurrency=args.concurrency
    )
    python_cpu = time.process_time() - python_before
    cost = await redis_cost(redis, cpu_before, args.requests)
    check_python_run(outcomes, await engine.stock(PYTHON_ITEM), args.requests)
    return EngineRun(args.requests / seconds, python_cpu * 1e6 / args.requests, cost)


# -- the run -------------------------------------------------------------------------------------


async def measure(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    assert server.port is not None
    redis = Redis.from_url(server.url, decode_responses=True)
    pipeliner = Pipeliner(server.url, connections=args.connections)
    try:
        version = (await redis.info("server"))["redis_version"]
        scripts = Scripts(redis, pipeliner=pipeliner)
        engine = RedisEngine(
            redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS, prefix=DEFAULT_PREFIX
        )
        print(f"redis-server {version} at {server.url} ({server.binary})")
        await scripts.load()
        now_sha = scripts[ScriptName.RESERVE].sha
        before = script_before(args.before)
        before_sha = None if before is None else await redis.script_load(before)
        if before is None:
            print(f"git cannot show reserve.lua at {args.before}: today's script alone")
        binary = shutil.which("redis-benchmark")
        if binary is None:
            print("redis-benchmark not on PATH: no server-side figures")

        before_runs: list[ScriptRun] = []
        now_runs: list[ScriptRun] = []
        engine_runs: list[EngineRun] = []
        for round_ in range(1, args.rounds + 1):
            if binary is not None:
                if before_sha is not None:
                    before_runs.append(
                        await benchmark_script(engine, binary, server.port, before_sha, args)
                    )
                now_runs.append(await benchmark_script(engine, binary, server.port, now_sha, args))
            engine_runs.append(await benchmark_engine(engine, args))
            print(
                f"round {round_}: "
                + (f"before {before_runs[-1].calls_per_s:,.0f}/s, " if before_runs else "")
                + (f"now {now_runs[-1].calls_per_s:,.0f}/s, " if now_runs else "")
                + f"engine {engine_runs[-1].reservations_per_s:,.0f}/s"
            )
    finally:
        await pipeliner.aclose()
        await redis.aclose()

    best_before = max(before_runs, key=lambda r: r.calls_per_s, default=None)
    best_now = max(now_runs, key=lambda r: r.calls_per_s, default=None)
    best_engine = max(engine_runs, key=lambda r: r.reservations_per_s)
    speedup = None if best_before is None or best_now is None else (
        best_now.calls_per_s / best_before.calls_per_s
    )  # fmt: skip
    ratio = None if best_now is None else best_engine.reservations_per_s / best_now.calls_per_s
    print(f"best of {args.rounds}, {args.requests:,} requests each, {args.concurrency} in flight:")
    for name, run in (
        (f"reserve.lua at {args.before}", best_before),
        ("reserve.lua now", best_now),
    ):
        if run is not None:
            print(f"  {name + ':':<24}{run.calls_per_s:>9,.0f} calls/s (redis-benchmark)")
            print(f"        {run.cost}")
    # Back to back, a round's two runs share whatever else the machine was doing.
    per_round = [
        now.calls_per_s / before.calls_per_s
        for before, now in zip(before_runs, now_runs, strict=True)
    ]
    if speedup is not None:
        print(
            f"  speedup {speedup:.2f} (today's script / the previous one, best against best); "
            f"per round {' '.join(f'{r:.2f}' for r in per_round)}, "
            f"median {statistics.median(per_round):.2f}"
        )
    print(
        f"  {'RedisEngine.reserve:':<24}{best_engine.reservations_per_s:>9,.0f} reservations/s "
        "(pipeliner, uvloop), all reserved, stock balanced"
    )
    print(f"        Python CPU {best_engine.python_cpu_us:.1f} µs/reservation; {best_engine.cost}")
    if ratio is not None:
        print(f"  ratio   {ratio:.2f} (Python engine / redis-benchmark of today's script)")
    return {
        "reservations_per_s": round(best_engine.reservations_per_s, 1),
        "redis_benchmark_per_s": None if best_now is None else best_now.calls_per_s,
        "before_per_s": None if best_before is None else best_before.calls_per_s,
        "speedup": None if speedup is None else round(speedup, 3),
        "speedup_median_of_rounds": round(statistics.median(per_round), 3) if per_round else None,
        "ratio": None if ratio is None else round(ratio, 3),
        "redis_cpu_us_per_call": None if best_now is None else round(best_now.cost.cpu_us, 1),
        "before_redis_cpu_us_per_call": (
            None if best_before is None else round(best_before.cost.cpu_us, 1)
        ),
        "engine_python_cpu_us": round(best_engine.python_cpu_us, 1),
        "engine_redis_cpu_us": round(best_engine.cost.cpu_us, 1),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "before": args.before,
        "redis_version": version,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with RedisServer(binary=redis_binary(args.redis_server), port=free_port()) as server:
        result = uvloop.run(measure(server, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
