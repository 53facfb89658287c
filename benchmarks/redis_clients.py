"""Which Redis client for the purchase path: the same EVALSHA of reserve.lua through each one.

One private redis-server, one Python process on uvloop, ``--concurrency`` asyncio tasks issuing
``--calls`` reservations in all (or for ``--seconds`` each), one client at a time:

* ``redis_py``: ``redis.asyncio`` as the product uses it today: a ``BlockingConnectionPool`` of
  ``--connections`` (64), hiredis parser if installed, one connection per call in flight.
* ``redis_py_coalesced``: redis-py under the product's ``Pipeliner`` (seckill.engine.pipelining):
  the calls made in one event-loop tick go out in one write on one of ``--pipelines``
  connections, each caller awaiting its own future; a batch size histogram is reported.
* ``coredis``: its default client. coredis 6 multiplexes: a connection goes back to the pool as
  soon as the command is queued, and one writer task per connection sends all queued commands in
  one write; so concurrent calls are pipelined without asking.
* ``glide`` and ``glide_script``: valkey-glide's standalone client (a Rust core multiplexing one
  connection), with ``custom_command(["EVALSHA", ...])`` and with its own ``invoke_script``.
* ``engine`` and ``engine_coalesced``: for context, the product's whole path,
  ``RedisEngine.reserve`` (input checks, ``Scripts.call`` with its metric, reply parsing), first
  as it runs without a pipeliner, then wired with one as ``open_runtime`` wires it.

Every call is a real reservation: a fresh item per client with units for all, distinct buyers,
idempotency keys and order ids. After each client the item's ``held`` must equal the calls
answered ``reserved`` (so nothing was dropped or run twice); the database is then flushed, the
scripts stay. Figures per client: calls/s, p50 and p99 of each call's latency (measured around
the await), and the ratio of calls/s to ``redis_py``'s. A client that is not installed is skipped.

``redis-benchmark`` then runs the same script at the same concurrency, without and with ``-P 16``,
as ``benchmarks/engine.py`` does (fresh buyers, keys and order ids from ``__rand_int__``): what
the server does for this script with a client that costs next to nothing.

Note the machine: redis-server, the Python process and any client threads share its cores.
The script starts its own redis-server on a free loopback port and throws it away afterwards; it
never touches any other Redis. The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.metadata
import itertools
import json
import platform
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.utils import HIREDIS_AVAILABLE

from benchmarks.engine import IDEMPOTENCY_TTL_MS, benchmark_command, load, run_redis_benchmark
from benchmarks.harness import free_port, redis_binary
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.engine.pipelining import DEFAULT_CONNECTIONS, Pipeliner
from seckill.engine.scripts import ScriptName, Scripts, script_text
from seckill.redis_server import RedisServer

# A client under test: (sha, keys, args) -> the script's reply.
EvalSha = Callable[[str, Sequence[str], Sequence[str]], Awaitable[Any]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="reservations per client")
    parser.add_argument(
        "--seconds", type=float, help="run each client this long instead of --calls"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="calls in flight")
    parser.add_argument("--connections", type=int, default=64, help="redis-py pool size")
    parser.add_argument(
        "--pipelines",
        type=int,
        default=DEFAULT_CONNECTIONS,
        help="the Pipeliner's connections (default: the product's)",
    )
    parser.add_argument("--pipeline", type=int, default=16, help="redis-benchmark -P")
    parser.add_argument(
        "--clients", help="comma-separated subset of: " + ",".join(c.key for c in CLIENTS)
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("calls", "concurrency", "connections", "pipelines", "pipeline"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.seconds is not None and args.seconds <= 0:
        parser.error("--seconds must be positive")
    known = {c.key for c in CLIENTS}
    args.only = None if args.clients is None else set(args.clients.split(","))
    if args.only is not None and not args.only <= known:
        parser.error(f"unknown clients: {sorted(args.only - known)}")
    return args


def take_batches(pipeliner: Pipeliner) -> dict[str, Any]:
    """The batch sizes seen since the last look: pipelines sent, mean, median, max, commonest."""
    sizes = pipeliner.batch_sizes.copy()
    pipeliner.batch_sizes.clear()
    pipelines = sum(sizes.values())
    calls = sum(size * n for size, n in sizes.items())
    ordered = sorted(sizes.elements())
    return {
        "pipelines": pipelines,
        "mean": round(calls / pipelines, 1) if pipelines else None,
        "p50": ordered[len(ordered) // 2] if ordered else None,
        "max": max(sizes) if sizes else None,
        "top": {str(size): n for size, n in sizes.most_common(5)},
    }


@dataclass(slots=True)
class Run:
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def calls(self) -> int:
        return len(self.latencies)

    def percentile_ms(self, p: int) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[p - 1] * 1000


def first_word(reply: Any) -> str:
    word = reply[0]
    return word.decode() if isinstance(word, bytes) else str(word)


async def drive(call: Call, *, calls: int, seconds: float | None, concurrency: int) -> Run:
    """``call(i, order_id, buyer)`` from ``concurrency`` tasks: each takes the next number."""
    run = Run()
    order_ids = OrderIds(worker_id=1)
    numbers = iter(range(calls)) if seconds is None else itertools.count()
    deadline = None if seconds is None else time.perf_counter() + seconds
    clock = time.perf_counter

    async def task() -> None:
        for i in numbers:
            if deadline is not None and clock() > deadline:
                return
            order_id = order_ids.next()
            started = clock()
            try:
                outcome = await call(i, order_id, f"b{i}")
            except Exception as exc:  # counted, so the check below reports it
                outcome = f"error: {type(exc).__name__}: {exc}"
            run.latencies.append(clock() - started)
            run.outcomes[outcome] += 1

    started = clock()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(task())
    run.seconds = clock() - started
    return run


def raw_call(evalsha: EvalSha, sha: str, item_id: int) -> Call:
    """The EVALSHA ``RedisEngine.reserve`` sends, built by hand, as strings for every client."""
    keys = item_keys(item_id, DEFAULT_PREFIX)
    fixed = keys.all_fixed()
    item, ttl = str(item_id), str(IDEMPOTENCY_TTL_MS)

    async def call(i: int, order_id: int, buyer: str) -> str:
        script_keys = (*fixed, keys.idempotency(buyer, f"k{i}"), keys.rate(buyer))
        # ARGV: item, buyer, quantity, order id, ttl, now (Redis TIME), no rate limit, request id
        script_args = (item, buyer, "1", str(order_id), ttl, "", "", "", "")
        return first_word(await evalsha(sha, script_keys, script_args))

    return call


def engine_call(engine: RedisEngine, item_id: int) -> Call:
    async def call(i: int, order_id: int, buyer: str) -> str:
        reservation = await engine.reserve(
            item_id, buyer=buyer, quantity=1, idempotency_key=f"k{i}", order_id=order_id
        )
        return "replay" if reservation.replayed else reservation.outcome.value

    return call


Call = Callable[[int, int, str], Awaitable[str]]  # (number, order id, buyer) -> outcome


@dataclass(slots=True)
class Opened:
    bind: Callable[[int], Call]  # item id -> the call reserving one unit of it
    info: dict[str, Any]
    warm_up: Callable[[], Awaitable[Any]] | None = None
    after: Callable[[], dict[str, Any]] | None = None  # figures since it was last called


@dataclass(frozen=True, slots=True)
class Context:
    server: RedisServer
    args: argparse.Namespace
    sha: str


Opener = Callable[[Context], contextlib.AbstractAsyncContextManager[Opened]]


@dataclass(frozen=True, slots=True)
class Client:
    key: str
    title: str
    package: str  # the distribution that must be installed
    open: Opener


def redis_py_pool(ctx: Context, connections: int) -> Redis:
    pool = BlockingConnectionPool.from_url(
        ctx.server.url, decode_responses=True, max_connections=connections
    )
    return Redis.from_pool(pool)


def redis_py_info(connections: int) -> dict[str, Any]:
    parser = "hiredis" if HIREDIS_AVAILABLE else "python"
    return {"version": version("redis"), "parser": parser, "connections": connections}


async def open_connections(redis: Redis, n: int) -> None:
    """Open the pool's connections before the clock starts."""
    await asyncio.gather(*(redis.ping() for _ in range(n)))


@contextlib.asynccontextmanager
async def open_redis_py(ctx: Context) -> AsyncIterator[Opened]:
    n = ctx.args.connections
    redis = redis_py_pool(ctx, n)
    try:

        async def evalsha(sha: str, keys: Sequence[str], args: Sequence[str]) -> Any:
            return await redis.evalsha(sha, len(keys), *keys, *args)

        warm = min(n, ctx.args.concurrency)
        yield Opened(
            functools.partial(raw_call, evalsha, ctx.sha),
            redis_py_info(n),
            warm_up=lambda: open_connections(redis, warm),
        )
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def open_redis_py_coalesced(ctx: Context) -> AsyncIterator[Opened]:
    n = ctx.args.pipelines
    pipeliner = Pipeliner(ctx.server.url, connections=n)
    try:

        def evalsha(sha: str, keys: Sequence[str], args: Sequence[str]) -> Awaitable[Any]:
            return pipeliner.execute("EVALSHA", sha, len(keys), *keys, *args)

        # No warm-up call: the untimed warm-up run opens the connections.
        yield Opened(
            functools.partial(raw_call, evalsha, ctx.sha),
            redis_py_info(n),
            after=lambda: {"batches": take_batches(pipeliner)},
        )
    finally:
        await pipeliner.aclose()


@contextlib.asynccontextmanager
async def open_coredis(ctx: Context) -> AsyncIterator[Opened]:
    import coredis

    client = coredis.Redis(
        "127.0.0.1", ctx.server.port, decode_responses=True, max_connections=ctx.args.connections
    )
    pool = client.connection_pool
    async with client:

        async def evalsha(sha: str, keys: Sequence[str], args: Sequence[str]) -> Any:
            return await client.evalsha(sha, keys, args)

        yield Opened(
            functools.partial(raw_call, evalsha, ctx.sha),
            {"version": version("coredis"), "max_connections": ctx.args.connections},
            warm_up=lambda: asyncio.gather(*(client.ping() for _ in range(ctx.args.concurrency))),
            after=lambda: {"connections_opened": len(getattr(pool, "_online_connections", ()))},
        )


@contextlib.asynccontextmanager
async def open_glide(ctx: Context, *, script: bool) -> AsyncIterator[Opened]:
    from glide import GlideClient, GlideClientConfiguration, NodeAddress, Script

    assert ctx.server.port is not None
    config = GlideClientConfiguration(
        [NodeAddress("127.0.0.1", ctx.server.port)],
        request_timeout=30_000,  # the default 250 ms is a load-shedding choice, not measured here
    )
    client = await GlideClient.create(config)
    try:
        if script:
            lua = Script(script_text(ScriptName.RESERVE))

            async def evalsha(sha: str, keys: Sequence[str], args: Sequence[str]) -> Any:
                return await client.invoke_script(lua, list(keys), list(args))

        else:

            async def evalsha(sha: str, keys: Sequence[str], args: Sequence[str]) -> Any:
                return await client.custom_command(["EVALSHA", sha, str(len(keys)), *keys, *args])

        yield Opened(
            functools.partial(raw_call, evalsha, ctx.sha),
            {"version": version("valkey-glide"), "connections": 1},
            warm_up=client.ping,
        )
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def open_engine(ctx: Context, *, coalesced: bool) -> AsyncIterator[Opened]:
    n = ctx.args.pipelines if coalesced else ctx.args.connections
    # With a pipeliner, the client's pool serves only what does not go through it, as in
    # open_runtime (a pool of its own size there; one connection is plenty here).
    redis = redis_py_pool(ctx, 1 if coalesced else n)
    pipeliner = Pipeliner(ctx.server.url, connections=n) if coalesced else None
    try:
        scripts = Scripts(redis, pipeliner=pipeliner)
        engine = RedisEngine(
            redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS, prefix=DEFAULT_PREFIX
        )

        def after() -> dict[str, Any]:
            return {} if pipeliner is None else {"batches": take_batches(pipeliner)}

        async def warm_up() -> None:
            if pipeliner is None:  # a pipeliner's connections open in the warm-up run
                await open_connections(redis, min(n, ctx.args.concurrency))

        yield Opened(functools.partial(engine_call, engine), redis_py_info(n), warm_up, after)
    finally:
        if pipeliner is not None:
            await pipeliner.aclose()
        await redis.aclose()


CLIENTS = (
    Client("redis_py", "redis-py asyncio, pool (today)", "redis", open_redis_py),
    Client("redis_py_coalesced", "redis-py + Pipeliner", "redis", open_redis_py_coalesced),
    Client("coredis", "coredis (multiplexed)", "coredis", open_coredis),
    Client(
        "glide",
        "valkey-glide custom_command",
        "valkey-glide",
        lambda ctx: open_glide(ctx, script=False),
    ),
    Client(
        "glide_script",
        "valkey-glide invoke_script",
        "valkey-glide",
        lambda ctx: open_glide(ctx, script=True),
    ),
    Client(
        "engine",
        "RedisEngine.reserve, pool (today)",
        "redis",
        lambda ctx: open_engine(ctx, coalesced=False),
    ),
    Client(
        "engine_coalesced",
        "RedisEngine.reserve + Pipeliner",
        "redis",
        lambda ctx: open_engine(ctx, coalesced=True),
    ),
)


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


async def measure_client(
    client: Client,
    ctx: Context,
    admin: RedisEngine,
    args: argparse.Namespace,
    items: tuple[int, int],
) -> dict[str, Any]:
    scratch, item_id = items
    async with client.open(ctx) as opened:
        if opened.warm_up is not None:
            await opened.warm_up()
        # Untimed: the client's code paths and the server warm up on an item of their own.
        await load(admin, scratch)
        await drive(
            opened.bind(scratch),
            calls=max(1, args.calls // 20),
            seconds=None,
            concurrency=args.concurrency,
        )
        await admin.redis.flushall()  # the measured run starts on an empty database
        await load(admin, item_id)
        if opened.after is not None:
            opened.after()  # drop the warm-up's figures
        run = await drive(
            opened.bind(item_id),
            calls=args.calls,
            seconds=args.seconds,
            concurrency=args.concurrency,
        )
        extra = opened.after() if opened.after is not None else {}
    stock = await admin.stock(item_id)
    held = None if stock is None else stock.held
    reserved = run.outcomes[Outcome.RESERVED.value]
    ok = run.outcomes == Counter({Outcome.RESERVED.value: run.calls}) and held == reserved
    await admin.redis.flushall()  # scripts stay
    return {
        "calls_per_s": round(run.calls / run.seconds, 1),
        "p50_ms": round(run.percentile_ms(50), 3),
        "p99_ms": round(run.percentile_ms(99), 3),
        "calls": run.calls,
        "seconds": round(run.seconds, 3),
        "reserved": reserved,
        "held": held,
        "check": "ok" if ok else f"FAILED: outcomes {dict(run.outcomes)}, held {held}",
        **opened.info,
        **extra,
    }


async def measure_redis_benchmark(
    ctx: Context, admin: RedisEngine, args: argparse.Namespace, pipeline: int, item_id: int
) -> dict[str, Any] | None:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    assert ctx.server.port is not None
    await load(admin, item_id)
    command = benchmark_command(
        binary,
        port=ctx.server.port,
        requests=args.calls,
        clients=args.concurrency,
        sha=ctx.sha,
        keys=admin.keys(item_id),
    )
    at = command.index("EVALSHA")
    command[at:at] = ["-P", str(pipeline)]
    calls_per_s = await run_redis_benchmark(command)
    stock = await admin.stock(item_id)
    await admin.redis.flushall()
    return {
        "calls_per_s": calls_per_s,
        "pipeline": pipeline,
        "requests": args.calls,
        "held": None if stock is None else stock.held,
    }


def row(title: str, figures: dict[str, Any], base: float | None) -> str:
    ratio = "" if base is None else f"{figures['calls_per_s'] / base:6.2f}"
    return (
        f"{title:<36} {figures['calls_per_s']:>10,.0f} {figures['p50_ms']:>8.2f} "
        f"{figures['p99_ms']:>8.2f} {ratio:>6}  {figures['check']}"
    )


async def measure(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    admin_redis = Redis.from_url(server.url, decode_responses=True)
    try:
        scripts = Scripts(admin_redis)
        await scripts.load()
        admin = RedisEngine(
            admin_redis,
            scripts=scripts,
            idempotency_ttl_ms=IDEMPOTENCY_TTL_MS,
            prefix=DEFAULT_PREFIX,
        )
        sha = scripts[ScriptName.RESERVE].sha
        redis_version = (await admin_redis.info("server"))["redis_version"]
        print(f"redis-server {redis_version} at {server.url} ({server.binary})")
        print(
            f"python {platform.python_version()} on uvloop {version('uvloop')}, "
            f"{args.concurrency} tasks, "
            + (f"{args.seconds} s" if args.seconds else f"{args.calls:,} calls")
            + " per client"
        )
        results: dict[str, Any] = {}
        print(f"\n{'client':<36} {'calls/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6}  check")
        for n, client in enumerate(CLIENTS, start=1):
            if args.only is not None and client.key not in args.only:
                continue
            if version(client.package) is None:
                results[client.key] = {"skipped": f"{client.package} is not installed"}
                print(f"{client.title:<36} skipped: {client.package} is not installed")
                continue
            ctx = Context(server, args, sha)
            figures = await measure_client(client, ctx, admin, args, (100 + n, n))
            results[client.key] = figures
            base = results.get("redis_py", {}).get("calls_per_s")
            print(row(client.title, figures, base))
            if "batches" in figures:
                print(f"{'':<4}batch sizes: {figures['batches']}")

        base = results.get("redis_py", {}).get("calls_per_s")
        for figures in results.values():
            if base and "calls_per_s" in figures:
                figures["ratio_to_redis_py"] = round(figures["calls_per_s"] / base, 3)

        bench: dict[str, Any] = {}
        for n, pipeline in enumerate((1, args.pipeline), start=len(CLIENTS) + 1):
            ctx = Context(server, args, sha)
            figures = await measure_redis_benchmark(ctx, admin, args, pipeline, n)
            if figures is None:
                print("redis-benchmark not on PATH: no server-side figure")
                break
            bench[f"P{pipeline}"] = figures
            print(
                f"redis-benchmark EVALSHA -P {pipeline:<2}{'':<16} {figures['calls_per_s']:>10,.0f}"
                f"{'':<25}held {figures['held']} of {figures['requests']}"
            )
    finally:
        await admin_redis.aclose()

    failed = [k for k, f in results.items() if f.get("check", "ok") != "ok"]
    if failed:
        print(f"check FAILED for: {', '.join(failed)}")
    return {
        "clients": results,
        "redis_benchmark": bench,
        "calls": args.calls,
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "redis_version": redis_version,
        "python": platform.python_version(),
        "uvloop": version("uvloop"),
        "checks_ok": not failed,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import uvloop
    except ImportError:
        sys.exit("uvloop is not installed: this benchmark measures clients on uvloop")
    server = RedisServer(binary=redis_binary(args.redis_server), port=free_port())
    with server, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(measure(server, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
