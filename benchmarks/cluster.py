"""Reservations on one Redis against a 3-master Redis Cluster: the same load, one run.

Two targets, one after the other, each a throwaway server started by this script from the same
redis-server binary, with AOF on (``appendfsync everysec``, the product's default):

* ``one redis``: one redis-server;
* ``cluster``: ``seckill.redis_cluster.LocalCluster`` with ``--masters`` primaries (3) and
  ``--replicas`` replicas each (0: replication would cost the cluster CPU the single server does
  not pay; give 1 to see it).

On each, ``--items`` items (3) whose slots fall one per master on the cluster (the same ids on
the one Redis), each of a stock that never runs out, so every call runs the whole reservation.
``--processes`` driver processes (2) each open the product's runtime exactly as ``seckill api``
does (``bootstrap.open_runtime``: the engine, its pipeliner, per node on a cluster) and keep
``--concurrency`` reservations in flight (64), each a new buyer, spread round-robin over the
items, for ``--duration`` seconds after ``--warm-up``. No HTTP: this measures what the engine
and Redis cost, not the web stack (``benchmarks/http.py`` measures that).

Then one hot item on the cluster, twice: with its stock in one shard (one master decides every
purchase) and over ``--stock-shards`` shards (6; an item id whose shards fall evenly on the
masters), every reservation a new buyer, so each is decided on the buyer's home shard.

Reported per target: reservations/s, p50/p99 per call (ms), CPU seconds per wall second of the
drivers together and of each redis-server (from /proc), each node's share of the Redis CPU and,
with several items, the reservations it decided and its Redis CPU µs per reservation. ``ratio``
is the cluster's reservations/s over the one Redis's; ``hottest_share`` of the hot item, the
busiest master's part of all Redis CPU (1.0 in one shard, about 1/3 over three masters).
Afterwards every item is audited (available + held + sold == total, held equal to
the reservations answered); a failed audit exits 1.

How to read it: on a machine with few cores the drivers (Python) saturate the CPUs long before
Redis does, so both targets reach about the same reservations/s, and the cluster's worth shows in
the Redis CPU per node: each master decides its own items' reservations, a third of the work.
On a machine with spare cores, more driver processes (API processes in production) raise the
one Redis until its one core is full (about 55 µs of Redis CPU per purchase: some 18,000 a
second here, docs/benchmarks.md), and the cluster from there on by one such core per master.
The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from redis.asyncio.cluster import RedisCluster

from benchmarks.harness import cpu_seconds, durable_redis, redis_binary
from seckill.bootstrap.runtime import open_runtime
from seckill.config import Settings
from seckill.domain.items import SaleItem
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.redis_cluster import LocalCluster

TOTAL = 10**9  # never sells out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="timed seconds per target")
    parser.add_argument("--warm-up", type=float, default=2.0, help="seconds before the clock")
    parser.add_argument("--processes", type=int, default=2, help="driver processes")
    parser.add_argument("--concurrency", type=int, default=64, help="calls in flight, each")
    parser.add_argument("--items", type=int, default=3)
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=0)
    parser.add_argument("--stock-shards", type=int, default=6, help="the hot item's shards")
    parser.add_argument("--redis-server", help="redis-server binary (default: PATH, else bundled)")
    return parser.parse_args(argv)


# -- the servers ---------------------------------------------------------------------------------

Target = tuple[str, bool, dict[str, int]]  # the URL, whether a cluster, node name -> its pid


@contextmanager
def one_redis(
    args: argparse.Namespace, workdir: Path
) -> Iterator[tuple[str, bool, dict[str, int]]]:
    with durable_redis(args.redis_server, workdir / "redis") as server:
        assert server.process is not None and server.port is not None
        yield server.url, False, {f"127.0.0.1:{server.port}": server.process.pid}


@contextmanager
def cluster(args: argparse.Namespace, workdir: Path) -> Iterator[Target]:
    binary = str(redis_binary(args.redis_server))
    with LocalCluster(
        masters=args.masters, replicas=args.replicas, binary=binary, appendonly=True
    ) as running:
        pids = {
            f"127.0.0.1:{node.port}": node.process.pid
            for node in running.nodes
            if node.process is not None and node.port in running.primary_ports()
        }
        yield running.url, True, pids


async def spread_items(url: str, cluster_mode: bool, count: int) -> dict[int, str]:
    """``count`` item ids taking the masters in turn: item id -> node name ("" on one Redis)."""
    if not cluster_mode:
        return dict.fromkeys(range(1, count + 1), "")
    client = RedisCluster.from_url(url)
    try:
        await client.initialize()
        masters = len(client.get_primaries())
        by_node: dict[str, list[int]] = {}
        item_id = 0
        while len(by_node) < masters or min(map(len, by_node.values())) < -(-count // masters):
            item_id += 1
            node = client.get_node_from_key(item_keys(item_id, DEFAULT_PREFIX).item)
            assert node is not None
            by_node.setdefault(node.name, []).append(item_id)
    finally:
        await client.aclose()
    turns = list(by_node.items())
    return {turns[n % masters][1][n // masters]: turns[n % masters][0] for n in range(count)}


async def evenly_sharded_item(url: str, shards: int) -> int:
    """The first item id whose ``shards`` stock shards fall as evenly as can be on the masters."""
    client = RedisCluster.from_url(url)
    try:
        await client.initialize()
        masters = len(client.get_primaries())
        for item_id in range(1, 100_000):
            nodes = Counter(
                client.get_node_from_key(item_keys(item_id, DEFAULT_PREFIX, shard=s).item).name  # type: ignore[union-attr]
                for s in range(shards)
            )
            if len(nodes) == min(masters, shards) and max(nodes.values()) == -(-shards // masters):
                return item_id
    finally:
        await client.aclose()
    raise RuntimeError(f"no item id spreads {shards} shards evenly")


# -- the drivers ---------------------------------------------------------------------------------


def settings_for(url: str, cluster_mode: bool, data_dir: Path, worker_id: int) -> Settings:
    return Settings(
        redis_url=url, redis_cluster=cluster_mode, data_dir=data_dir, worker_id=worker_id,
        rate_limit_requests=1_000_000,
    )  # fmt: skip


async def load_items(
    url: str, cluster_mode: bool, data_dir: Path, item_ids: list[int], stock_shards: int
) -> None:
    now = int(time.time() * 1000)
    async with open_runtime(settings_for(url, cluster_mode, data_dir, 0)) as runtime:
        for item_id in item_ids:
            item = SaleItem(
                item_id=item_id, total=TOTAL, starts_at_ms=now - 60_000,
                ends_at_ms=now + 3_600_000, per_buyer_limit=1, hold_ms=3_600_000,
                stock_shards=stock_shards,
            )  # fmt: skip
            await runtime.engine.load_item(item)


async def drive(
    url: str, cluster_mode: bool, data_dir: Path, worker_id: int, item_ids: list[int],
    concurrency: int, start_at: float, warm_up: float, duration: float,
) -> dict[str, Any]:  # fmt: skip
    """Keep ``concurrency`` reservations in flight; what the timed part saw."""
    latencies: list[float] = []
    reserved: Counter[int] = Counter()
    other: Counter[str] = Counter()
    async with open_runtime(settings_for(url, cluster_mode, data_dir, worker_id)) as runtime:
        engine, ids = runtime.engine, runtime.order_ids
        await asyncio.sleep(max(0.0, start_at - time.time()))
        timed_from = time.monotonic() + warm_up
        stop_at = timed_from + duration
        serial = 0

        async def caller(lane: int) -> None:
            nonlocal serial
            n = lane
            while (now := time.monotonic()) < stop_at:
                serial += 1
                item_id = item_ids[n % len(item_ids)]
                buyer = f"w{worker_id}-{serial}"
                n += 1
                answer = await engine.reserve(
                    item_id, buyer=buyer, quantity=1, idempotency_key="k", order_id=ids.next()
                )
                if now >= timed_from:
                    latencies.append(time.monotonic() - now)
                    if answer.accepted:
                        reserved[item_id] += 1
                    else:
                        other[answer.outcome.value] += 1

        cpu: list[float] = []

        async def clock_cpu() -> None:  # this process's CPU over the timed part only
            for at in (timed_from, stop_at):
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                cpu.append(time.process_time())

        await asyncio.gather(clock_cpu(), *(caller(lane) for lane in range(concurrency)))
    return {
        "latencies": latencies, "reserved": dict(reserved), "other": dict(other),
        "cpu": cpu[1] - cpu[0],
    }  # fmt: skip


def drive_in_process(*options: Any) -> dict[str, Any]:
    return asyncio.run(drive(*options))


def measure(
    name: str, servers: Any, args: argparse.Namespace, workdir: Path, *, hot_shards: int = 0
) -> dict[str, Any]:
    """One target: ``args.items`` items in one shard each, or (``hot_shards``) one item over
    that many shards."""
    slug = name.replace(" ", "-").replace(",", "")
    data_dir = workdir / slug
    data_dir.mkdir()
    with servers(args, workdir / f"{slug}-redis") as (url, cluster_mode, pids):
        if hot_shards:
            items = {asyncio.run(evenly_sharded_item(url, hot_shards)): ""}
        else:
            items = asyncio.run(spread_items(url, cluster_mode, args.items))
        asyncio.run(load_items(url, cluster_mode, data_dir, list(items), max(hot_shards, 1)))
        start_at = time.time() + 1.5  # every driver has connected by then
        options = [
            (url, cluster_mode, data_dir, worker_id, list(items), args.concurrency, start_at,
             args.warm_up, args.duration)
            for worker_id in range(1, args.processes + 1)
        ]  # fmt: skip
        with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
            pending = pool.starmap_async(drive_in_process, options)
            time.sleep(max(0.0, start_at - time.time()) + args.warm_up)
            redis_before = {node: cpu_seconds(pid) for node, pid in pids.items()}
            time.sleep(args.duration)
            redis_cpu = {node: cpu_seconds(pid) - redis_before[node] for node, pid in pids.items()}
            found = pending.get()
        audit = asyncio.run(audit_items(url, cluster_mode, data_dir, found))
    latencies = sorted(x for part in found for x in part["latencies"])
    reserved: Counter[int] = Counter()
    for part in found:
        reserved.update({int(k): v for k, v in part["reserved"].items()})
    total = sum(reserved.values())
    per_node: Counter[str] = Counter()
    if not hot_shards:  # a hot item's reservations fall on its shards: not counted per node
        for item_id, count in reserved.items():
            per_node[items[item_id] or next(iter(pids))] += count
    all_cpu = sum(redis_cpu.values()) or 1.0
    nodes = {
        node: {
            "reservations": per_node[node] if per_node else None,
            "cpu_s_per_s": round(redis_cpu[node] / args.duration, 3),
            "cpu_share": round(redis_cpu[node] / all_cpu, 3),
            "us_per_reservation": round(redis_cpu[node] / per_node[node] * 1e6, 1)
            if per_node[node] else None,
        }
        for node in pids
    }  # fmt: skip
    result = {
        "reservations_per_s": round(total / args.duration, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
        "p99_ms": round(latencies[len(latencies) * 99 // 100] * 1000, 2) if latencies else None,
        "drivers_cpu_s_per_s": round(sum(p["cpu"] for p in found) / args.duration, 2),
        "refused": sum((Counter(p["other"]) for p in found), Counter()),
        "nodes": nodes,
        "hottest_share": max(n["cpu_share"] for n in nodes.values()),
        "redis_cpu_us_per_reservation": round(all_cpu / total * 1e6, 1) if total else None,
        "audit": audit,
    }
    print(f"\n{name}: {result['reservations_per_s']:,.0f} reservations/s, p50 "
          f"{result['p50_ms']} ms, p99 {result['p99_ms']} ms, drivers "
          f"{result['drivers_cpu_s_per_s']} CPU s/s")  # fmt: skip
    for node, figures in nodes.items():
        decided = (
            "" if figures["reservations"] is None else f"{figures['reservations']:,} reservations, "
        )
        each = (
            ""
            if figures["us_per_reservation"] is None
            else f", {figures['us_per_reservation']} µs each"
        )
        print(
            f"  {node}: {decided}Redis {figures['cpu_s_per_s']} CPU s/s "
            f"({figures['cpu_share']:.0%} of all Redis CPU){each}"
        )
    print(f"  Redis CPU per reservation, all nodes: {result['redis_cpu_us_per_reservation']} µs")
    print(f"  audit: {'passed' if audit['passed'] else 'FAILED'} {audit['problems']}")
    return result


async def audit_items(
    url: str, cluster_mode: bool, data_dir: Path, found: list[dict[str, Any]]
) -> dict[str, Any]:
    """Every item balanced, and holding exactly the reservations answered (warm-up's too, which
    the drivers do not count: so held >= counted)."""
    problems = []
    async with open_runtime(settings_for(url, cluster_mode, data_dir, 0)) as runtime:
        counted: Counter[int] = Counter()
        for part in found:
            counted.update({int(k): v for k, v in part["reserved"].items()})
        for item_id in counted:
            stock = await runtime.engine.stock(item_id)
            if stock is None or stock.available + stock.held + stock.sold != stock.total:
                problems.append(f"item {item_id} unbalanced: {stock}")
            elif stock.held < counted[item_id]:
                problems.append(f"item {item_id} holds {stock.held} < {counted[item_id]} answered")
    return {"passed": not problems, "problems": problems}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        f"{args.processes} driver processes x {args.concurrency} in flight, {args.items} "
        f"items, {args.duration:g} s timed after {args.warm_up:g} s, {os.cpu_count()} CPUs; "
        f"cluster: {args.masters} masters, {args.replicas} replica(s) each",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="seckill-cluster-") as tmp:
        workdir = Path(tmp)
        hot = f"cluster, one item, {args.stock_shards} shards"
        results = {
            "one redis": measure("one redis", one_redis, args, workdir),
            "cluster": measure("cluster", cluster, args, workdir),
            "cluster, one item, 1 shard": measure(
                "cluster, one item, 1 shard", cluster, args, workdir, hot_shards=1
            ),
            hot: measure(hot, cluster, args, workdir, hot_shards=args.stock_shards),
        }
    single = results["one redis"]["reservations_per_s"]
    ratio = round(results["cluster"]["reservations_per_s"] / single, 3) if single else None
    print(f"\nratio (cluster / one redis): {ratio}")
    one_shard = results["cluster, one item, 1 shard"]
    print(
        f"one hot item: {one_shard['reservations_per_s']:,.0f}/s in 1 shard (hottest master "
        f"{one_shard['hottest_share']:.0%} of Redis CPU), {results[hot]['reservations_per_s']:,.0f}"
        f"/s over {args.stock_shards} (hottest master {results[hot]['hottest_share']:.0%})"
    )
    print(json.dumps({**results, "ratio": ratio, "args": vars(args)}))
    if not all(r["audit"]["passed"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
