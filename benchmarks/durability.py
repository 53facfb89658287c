"""What durability costs: reservations/s and latency, fast vs fsync always vs WAIT for a replica.

One run, the same workload three times, each on fresh private redis-servers with AOF on:

* ``fast``: the default. Answered once the primary ran the script; AOF ``appendfsync everysec``,
  so up to about a second of acknowledged writes can be lost if the server's machine crashes.
* ``fsync_always``: still ``fast`` on the client, but the server runs ``appendfsync always``: it
  fsyncs the AOF before it replies (a single node that loses nothing it acknowledged).
* ``wait_replica``: ``SECKILL_REDIS_DURABILITY=replicas`` with one replica attached (both
  ``everysec``): every write script goes out with ``WAIT 1 <timeout>`` in the same round trip.

Each is N reservations from distinct buyers on one big item through ``RedisEngine.reserve``,
from asyncio tasks sharing one connection pool, as the API calls it. Per call latency is taken
around ``reserve`` (p50, p99). The ratios are each setup's reservations/s over ``fast``'s.

The servers listen on free loopback ports, keep their files in a temporary directory (under
``--data-dir`` if given: fsync costs what that disk costs) and are thrown away afterwards. The
last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis

from benchmarks.engine import load, warm_up
from benchmarks.harness import durable_redis, redis_binary
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Durability, NotDurable, Scripts
from seckill.redis_server import RedisServer

ITEM = 1
IDEMPOTENCY_TTL_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Setup:
    key: str  # the name in the JSON line
    title: str
    appendfsync: str
    replica: bool


SETUPS = (
    Setup("fast", "fast, AOF appendfsync everysec", "everysec", replica=False),
    Setup("fsync_always", "fast, AOF appendfsync always", "always", replica=False),
    Setup("wait_replica", "replicas=1: WAIT, 1 replica, everysec", "everysec", replica=True),
)


@dataclass(frozen=True, slots=True)
class Figures:
    seconds: float
    latencies_ms: list[float]
    outcomes: Counter[str]

    @property
    def per_second(self) -> float:
        return len(self.latencies_ms) / self.seconds

    def percentile(self, p: int) -> float:
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[p - 1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="reservations per setup")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--connections", type=int, default=64, help="client pool size")
    parser.add_argument("--rounds", type=int, default=3, help="each setup runs once per round")
    parser.add_argument("--wait-timeout-ms", type=int, default=100, help="WAIT timeout")
    parser.add_argument("--data-dir", type=Path, help="where the servers' files go (a disk)")
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("requests", "rounds", "concurrency", "connections", "wait_timeout_ms"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


@contextlib.contextmanager
def private_servers(
    binary: Path, parent: Path | None, *, replica: bool
) -> Iterator[tuple[RedisServer, RedisServer | None]]:
    """A primary (and a replica) with AOF on, in a temporary directory removed afterwards."""
    with (
        tempfile.TemporaryDirectory(dir=parent, prefix="seckill-durability-") as tmp,
        contextlib.ExitStack() as servers,
    ):

        def start(name: str) -> RedisServer:
            return servers.enter_context(durable_redis(str(binary), Path(tmp) / name))

        primary = start("primary")
        yield primary, start("replica") if replica else None


async def attach(primary: Redis, replica: RedisServer, primary_port: int) -> None:
    """Make ``replica`` a replica of the primary; return once it acknowledges a write."""
    # Redis 7 delays a diskless full sync by 5 s by default, to batch replicas that come together.
    await primary.config_set("repl-diskless-sync-delay", 0)
    client = Redis.from_url(replica.url, decode_responses=True)
    try:
        await client.replicaof("127.0.0.1", primary_port)
    finally:
        await client.aclose()
    # "online" is not enough: after a diskless sync the primary may hold the stream back until
    # the replica's first ACK (up to a second later). A write made once it is online (so past
    # the sync's offset) and seen by WAIT is.
    deadline = time.monotonic() + 30
    while not any(
        isinstance(v, dict) and v.get("state") == "online"
        for v in (await primary.info("replication")).values()
    ):
        if time.monotonic() > deadline:
            sys.exit("the replica did not come online within 30 s")
        await asyncio.sleep(0.05)
    while True:
        async with primary.pipeline(transaction=False) as pipe:
            pipe.set("replication-probe", "1")
            pipe.wait(1, 100)
            _, acked = await pipe.execute()
        if acked:
            return
        if time.monotonic() > deadline:
            sys.exit("the replica did not acknowledge a write within 30 s")


async def reserve_all(engine: RedisEngine, *, requests: int, concurrency: int) -> Figures:
    """``requests`` reservations from distinct buyers, each one timed."""
    order_ids = OrderIds(worker_id=1)
    numbers = iter(range(requests))  # shared: a task takes the next buyer as soon as it is free
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()

    async def buyer() -> None:
        for i in numbers:
            started = time.perf_counter()
            try:
                reservation = await engine.reserve(
                    ITEM,
                    buyer=f"b{i}",
                    quantity=1,
                    idempotency_key=f"k{i}",
                    order_id=order_ids.next(),
                )
                outcome = reservation.outcome.value
            except NotDurable:
                outcome = "not_durable"
            latencies.append((time.perf_counter() - started) * 1000)
            outcomes[outcome] += 1

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(buyer())
    return Figures(time.perf_counter() - started, latencies, outcomes)


async def measure(
    setup: Setup, primary: RedisServer, replica: RedisServer | None, args: argparse.Namespace
) -> tuple[Figures, str]:
    assert primary.port is not None
    pool = BlockingConnectionPool.from_url(
        primary.url, decode_responses=True, max_connections=args.connections
    )
    redis = Redis.from_pool(pool)
    try:
        version = str((await redis.info("server"))["redis_version"])
        await redis.config_set("appendfsync", setup.appendfsync)
        fast_scripts = Scripts(redis)
        await fast_scripts.load()
        # Loaded before the replica attaches: its full sync carries the item, and the set-up is
        # not subject to a slow first acknowledgement (a replica busy right after its sync).
        await load(
            RedisEngine(redis, scripts=fast_scripts, idempotency_ttl_ms=1, prefix=DEFAULT_PREFIX),
            ITEM,
        )
        scripts = fast_scripts
        if replica is not None:
            await attach(redis, replica, primary.port)
            durability = Durability(replicas=1, timeout_ms=args.wait_timeout_ms)
            scripts = Scripts(redis, durability=durability)
        engine = RedisEngine(
            redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS, prefix=DEFAULT_PREFIX
        )
        await warm_up(redis, min(args.connections, args.concurrency))
        figures = await reserve_all(engine, requests=args.requests, concurrency=args.concurrency)
        # Every call wrote a hold, answered or not: not_durable ones too, on the primary.
        stock = await engine.stock(ITEM)
        if stock is None or not stock.balanced or stock.held != args.requests:
            sys.exit(f"{setup.key}: expected balanced stock with held={args.requests}: {stock}")
        unexpected = set(figures.outcomes) - {Outcome.RESERVED.value, "not_durable"}
        if unexpected:
            sys.exit(f"{setup.key}: unexpected outcomes {figures.outcomes}")
        return figures, version
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    binary = redis_binary(args.redis_server)
    where = args.data_dir or Path(tempfile.gettempdir())
    print(f"{binary}; data in {where}; {args.requests} reservations per setup and round, "
          f"{args.concurrency} in flight, {args.connections} connections")  # fmt: skip
    # Rounds interleave the setups, so a neighbour's load on the machine falls on all of them;
    # each figure is the median over the rounds.
    rounds: dict[str, list[Figures]] = {setup.key: [] for setup in SETUPS}
    version = ""
    for number in range(1, args.rounds + 1):
        for setup in SETUPS:
            with private_servers(binary, args.data_dir, replica=setup.replica) as servers:
                figures, version = asyncio.run(measure(setup, *servers, args))
            rounds[setup.key].append(figures)
            print(f"round {number}  {setup.key:<13} {figures.per_second:>9,.0f} reservations/s")
    print(f"redis-server {version}, median of {args.rounds} rounds:")

    rps = {key: statistics.median(f.per_second for f in runs) for key, runs in rounds.items()}
    p50 = {key: statistics.median(f.percentile(50) for f in runs) for key, runs in rounds.items()}
    p99 = {key: statistics.median(f.percentile(99) for f in runs) for key, runs in rounds.items()}
    print(f"{'setup':<40} {'reservations/s':>14} {'vs fast':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for setup in SETUPS:
        key = setup.key
        print(
            f"{setup.title:<40} {rps[key]:>14,.0f} {rps[key] / rps['fast']:>8.2f} "
            f"{p50[key]:>8.2f} {p99[key]:>8.2f}"
        )
    refused = sum(f.outcomes["not_durable"] for f in rounds["wait_replica"])
    print(f"not_durable answers with the replica attached: {refused} of "
          f"{args.requests * args.rounds}")  # fmt: skip

    summary: dict[str, Any] = {}
    for setup in SETUPS:
        summary[f"{setup.key}_rps"] = round(rps[setup.key], 1)
    for setup in SETUPS[1:]:
        summary[f"{setup.key}_ratio"] = round(rps[setup.key] / rps["fast"], 3)
    for setup in SETUPS:
        summary[f"{setup.key}_p50_ms"] = round(p50[setup.key], 2)
        summary[f"{setup.key}_p99_ms"] = round(p99[setup.key], 2)
    summary |= {
        "wait_replica_not_durable": refused,
        "requests": args.requests,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "redis_version": version,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
