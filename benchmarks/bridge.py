"""Bridge rate: a backlog of order events forwarded to each broker with confirms, beside the raw
publish rate of the same messages through the sink alone.

A backlog is built first in one item's stream through ``RedisEngine`` (``--orders``
reservations from distinct buyers, then every other order paid: 1.5 events per order), with no
worker running. Then, for each broker (RabbitMQ, NATS JetStream), on a topology of its own made
for the run (an exchange and a quorum queue; a stream on file storage) and deleted afterwards:

* ``events_per_s``: one ``Bridge`` (``--batch-size`` entries a pass) runs ``run_once`` until its
  consumer group's backlog on the stream is 0, exactly as the worker runs: XREADGROUP, decode,
  ask SQL which events have landed, publish the batch and wait for every confirm, XACK. Each
  broker's bridge has its own group, so
  each sees the whole backlog. ``bridge_cpu_us_per_event`` is this process's CPU over the run
  (the bridge runs in it), per event forwarded; ``broker_cpu_us_per_event`` the broker server's
  (beam.smp, nats-server: the process listening on the URL's port, found in /proc; null when it
  is not on this machine or cannot be found) and ``redis_cpu_us_per_event`` the redis-server's.
* ``raw_events_per_s``: the very messages the bridge sent (built from the stream before the
  clock starts) published straight through a fresh sink on a fresh topology, in batches of the
  same size, one batch at a time, each awaited until confirmed: no Redis, no bridge. ``ratio``
  is the bridge's rate over it: the share of what the broker takes with confirms that the bridge
  reaches after reading, decoding and acknowledging.

The backlog is landed in SQL by a ``Persister`` before the bridge's clock starts (a SQLite file
in a temporary directory unless ``--database-url`` names another database), as a running
deployment's persister lands it within tens of milliseconds.

After each run the broker must hold exactly the events (the queue's message count; the stream's
message count), else the audit fails and the script exits 1 after printing what it found.

Then, for each broker, the latency from purchase to message: ``--latency-orders`` purchases of
an item of their own, ``--latency-rate`` a second, with a persister and a bridge running as the
workers run (``run_until_stopped``, default settings) and a consumer subscribed to the run's
topology, all in this process. Each purchase is timed from its answer (the engine's reply, as
the API would answer 202) to its ``reserved`` message at the consumer: ``latency_ms`` gives
p50, p99 and the maximum.

Wall-clock figures depend on what else the machine runs: the load average before each run is
printed.

The script starts its own redis-server on a free loopback port, and creates and deletes its own
exchange, queue and stream (names with a random suffix); it touches nothing else but the
database ``--database-url`` names, if any. The last line
printed is one JSON object with the figures, one entry per broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import aio_pika
import nats
from aio_pika.abc import AbstractIncomingMessage
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from redis.asyncio import BlockingConnectionPool, Redis

from benchmarks.harness import cpu_spent, free_port, percentile, redis_binary
from seckill.domain.events import decode_event
from seckill.domain.ids import OrderIds
from seckill.domain.items import NewItem
from seckill.domain.money import Money
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, items_registry
from seckill.engine.scripts import Scripts
from seckill.engine.streams import GROUP, read_progress
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.sinks import Message, Sink, SinkUnavailable, bridge_group, order_message, sink_from_url
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.store.migrate import upgrade
from seckill.workers.bridge import Bridge, BridgeConfig
from seckill.workers.loop import run_until_stopped
from seckill.workers.persister import Persister

# The engine checks a charge against the unit price it is given: both nothing here.
UNPRICED = Money(0, "USD")

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_PORTS = {"rabbitmq": 5672, "nats": 4222}
BROKERS = ("rabbitmq", "nats")
IDEMPOTENCY_TTL_MS = 3_600_000
HOLD_S = 3_600  # no hold expires during a run
CONCURRENCY = 64  # engine calls in flight while the backlog is built
RUN_TIMEOUT_S = 600.0
COUNT_SETTLE_S = 5.0  # how long the audit waits for the broker's count to reach the events


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--orders", type=int, default=20_000,
        help="reservations in the backlog; every other one is then paid (events: 1.5 x orders)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=500, help="entries per bridge pass")
    parser.add_argument(
        "--amqp-url",
        default=os.environ.get("SECKILL_TEST_AMQP_URL") or DEFAULT_AMQP_URL,
        help="RabbitMQ (default: $SECKILL_TEST_AMQP_URL, else %(default)s)",
    )
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("SECKILL_TEST_NATS_URL") or DEFAULT_NATS_URL,
        help="NATS with JetStream (default: $SECKILL_TEST_NATS_URL, else %(default)s)",
    )
    parser.add_argument(
        "--broker", action="append", dest="brokers", choices=BROKERS,
        help="a broker to measure; give it once per broker (default: both)",
    )  # fmt: skip
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    parser.add_argument(
        "--database-url", default="",
        help="the SQL database the persister lands in (default: a SQLite file in a temporary "
        "directory); it is migrated, and items are added to it",
    )  # fmt: skip
    parser.add_argument(
        "--latency-orders", type=int, default=1_000,
        help="purchases timed from their answer to their message at a consumer, per broker",
    )  # fmt: skip
    parser.add_argument(
        "--latency-rate", type=float, default=200.0, help="purchases a second while timing"
    )
    args = parser.parse_args(argv)
    for name in ("orders", "batch_size", "latency_orders"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.latency_rate <= 0:
        parser.error("--latency-rate must be above 0")
    args.brokers = args.brokers or list(BROKERS)
    return args


# -- the brokers' server processes ---------------------------------------------------------------


def listening_pid(url: str, default_port: int) -> int | None:
    """The pid of the process listening on the URL's port of this machine, from /proc (a
    socket in LISTEN state, then the process holding it); None if elsewhere or not found."""
    parts = urlsplit(url)
    if parts.hostname not in {"127.0.0.1", "localhost", "::1", None}:
        return None
    port = parts.port or default_port
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    sockets.add(f"socket:[{inode}]")
    if not sockets:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in sockets:
                        return int(entry.name)
    return None


def process_name(pid: int | None) -> str | None:
    if pid is None:
        return None
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


# -- the run's own topology on each broker --------------------------------------------------------


class Topology(Protocol):
    """Names of the run's own on one broker: a sink on them, what they hold, their removal."""

    def sink(self) -> Sink: ...

    async def stored(self) -> int:
        """Messages the broker holds for the topology."""
        ...

    def consuming(
        self, on_body: Callable[[bytes], None]
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """A consumer of the topology's messages calling ``on_body`` with each one's body as
        it arrives, while the context lasts."""
        ...

    async def delete(self) -> None: ...


class RabbitMQTopology:
    """An exchange and a quorum queue of the run's own (the sink declares them on open)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = f"seckill.bench.{secrets.token_hex(4)}"

    def sink(self) -> Sink:
        return sink_from_url(self.url, exchange=self.name, queue=self.name)

    async def stored(self) -> int:
        connection = await aio_pika.connect(self.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(self.name, passive=True)
            count = queue.declaration_result.message_count
            return int(count or 0)

    @contextlib.asynccontextmanager
    async def consuming(self, on_body: Callable[[bytes], None]) -> AsyncIterator[None]:
        connection = await aio_pika.connect(self.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(self.name, passive=True)

            async def take(message: AbstractIncomingMessage) -> None:
                on_body(message.body)

            tag = await queue.consume(take, no_ack=True)
            try:
                yield
            finally:
                await queue.cancel(tag)

    async def delete(self) -> None:
        connection = await aio_pika.connect(self.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(self.name)
            await channel.exchange_delete(self.name)


class NatsTopology:
    """A stream of the run's own on its own subjects (the sink creates it on open)."""

    def __init__(self, url: str) -> None:
        self.url = url
        suffix = secrets.token_hex(4)
        self.stream = f"SECKILL_BENCH_{suffix}"
        self.subject_prefix = f"seckill.bench.{suffix}"

    def sink(self) -> Sink:
        return sink_from_url(self.url, stream=self.stream, subject_prefix=self.subject_prefix)

    async def stored(self) -> int:
        client = await nats.connect(self.url, connect_timeout=10, max_reconnect_attempts=1)
        try:
            info = await client.jetstream().stream_info(self.stream)
            return int(info.state.messages)
        finally:
            await client.close()

    @contextlib.asynccontextmanager
    async def consuming(self, on_body: Callable[[bytes], None]) -> AsyncIterator[None]:
        client = await nats.connect(self.url, connect_timeout=10, max_reconnect_attempts=1)
        try:
            # A push consumer of the stream, new messages only, acknowledging none.
            async def take(message: Msg) -> None:
                on_body(message.data)

            subscription = await client.jetstream().subscribe(
                f"{self.subject_prefix}.>", stream=self.stream, cb=take, manual_ack=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE),
            )  # fmt: skip
            try:
                yield
            finally:
                await subscription.unsubscribe()
        finally:
            await client.close()

    async def delete(self) -> None:
        client = await nats.connect(self.url, connect_timeout=10, max_reconnect_attempts=1)
        try:
            with contextlib.suppress(NotFoundError):
                await client.jetstream().delete_stream(self.stream)
        finally:
            await client.close()


def new_topology(broker: str, args: argparse.Namespace) -> Topology:
    if broker == "rabbitmq":
        return RabbitMQTopology(args.amqp_url)
    return NatsTopology(args.nats_url)


def broker_url(broker: str, args: argparse.Namespace) -> str:
    return str(args.amqp_url if broker == "rabbitmq" else args.nats_url)


# -- the backlog ---------------------------------------------------------------------------------


async def new_item(engine: RedisEngine, ledger: Ledger, *, total: int) -> int:
    """An item on sale now, in SQL and loaded into Redis; its id."""
    now = datetime.now(UTC)
    item_id = await ledger.create_item(
        NewItem(
            name="Bridge benchmark", price_cents=100, total=total,
            starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(seconds=2 * HOLD_S),
            per_buyer_limit=1, hold_seconds=HOLD_S,
        )
    )  # fmt: skip
    loaded = await warm_item(engine, ledger, item_id)
    if loaded is not Outcome.LOADED:
        sys.exit(f"item {item_id} did not load on a fresh Redis: {loaded}")
    return item_id


async def build_backlog(engine: RedisEngine, item_id: int, orders: int) -> Counter[str]:
    """``orders`` reservations from distinct buyers, then every other order paid;
    ``CONCURRENCY`` calls in flight. Counts each answer."""
    ids = OrderIds(worker_id=1)
    order_ids = [ids.next() for _ in range(orders)]
    outcomes: Counter[str] = Counter()

    async def reserve(turns: Iterator[int]) -> None:
        for i in turns:
            reservation = await engine.reserve(
                item_id, buyer=f"b{i}", quantity=1, idempotency_key=f"k{i}",
                order_id=order_ids[i],
            )  # fmt: skip
            outcomes[reservation.outcome.value] += 1

    async def pay(turns: Iterator[int]) -> None:
        for i in turns:
            settled = await engine.settle_payment(
                item_id,
                order_ids[i],
                payment_id=f"pay-{order_ids[i]}",
                succeeded=True,
                charged=UNPRICED,
                unit_price=UNPRICED,
            )
            outcomes[settled.outcome.value] += 1

    for step, numbers in ((reserve, range(orders)), (pay, range(0, orders, 2))):
        turns = iter(numbers)  # shared: a task takes the next order as soon as it is free
        async with asyncio.TaskGroup() as group:
            for _ in range(CONCURRENCY):
                group.create_task(step(turns))
    return outcomes


async def land(redis: Redis, ledger: Ledger, stream: str) -> None:
    """Run a persister until the stream is landed in SQL and acknowledged."""
    persister = Persister(redis=redis, ledger=ledger, prefix=DEFAULT_PREFIX, consumer="bench")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while await group_backlog(redis, stream, GROUP):
        await persister.run_once()
        if time.monotonic() > deadline:
            sys.exit(f"the persister did not land the backlog in {RUN_TIMEOUT_S} s")


async def stream_messages(redis: Redis, stream: str) -> list[Message]:
    """The messages the bridge sends for the stream's entries, in order (the yardstick's)."""
    messages = []
    entries = cast(list[tuple[str, dict[str, str]]], await redis.xrange(stream))
    for entry_id, fields in entries:
        message = order_message(decode_event(entry_id, fields), stream=stream)
        if message is not None:
            messages.append(message)
    return messages


# -- the two runs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    seconds: float  # wall clock, from the first read (or publish) to the last confirm
    events: int  # messages the broker confirmed
    cpu: dict[str, float]  # CPU seconds over the same span: "client", "broker", "redis"


async def group_backlog(redis: Redis, stream: str, group: str) -> int:
    [progress] = await read_progress(redis, [stream])
    return progress.of(group).backlog


async def run_bridge(
    redis: Redis, ledger: Ledger, sink: Sink, *, stream: str, events: int, batch_size: int,
    pids: dict[str, Any],
) -> Run:  # fmt: skip
    """One Bridge until its group's backlog on ``stream`` is 0."""
    bridge = Bridge(
        redis=redis, ledger=ledger, sink=sink, consumer="bench",
        config=BridgeConfig(batch_size=batch_size, block_ms=50),
        prefix=DEFAULT_PREFIX,
    )  # fmt: skip
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with cpu_spent(pids, own="client") as cpu:
        started = time.perf_counter()
        while True:
            forwarded = await bridge.run_once()
            # The group's backlog only when it can be 0: everything sent, or nothing came.
            maybe_done = forwarded == 0 or bridge.forwarded >= events
            if maybe_done and await group_backlog(redis, stream, bridge.group) == 0:
                break
            if time.monotonic() > deadline:
                sys.exit(f"the bridge did not drain in {RUN_TIMEOUT_S} s: {bridge.forwarded} sent")
        seconds = time.perf_counter() - started
    if bridge.dead_lettered:
        sys.exit(f"audit FAILED: the bridge dead-lettered {bridge.dead_lettered} entries")
    return Run(seconds=seconds, events=bridge.forwarded, cpu=cpu)


async def run_raw(
    sink: Sink, messages: Sequence[Message], *, batch_size: int, pids: dict[str, Any]
) -> Run:
    """The messages straight through the sink, one batch at a time, each confirmed."""
    batches = [messages[i : i + batch_size] for i in range(0, len(messages), batch_size)]
    with cpu_spent(pids, own="client") as cpu:
        started = time.perf_counter()
        for batch in batches:
            await sink.publish(batch)
        seconds = time.perf_counter() - started
    return Run(seconds=seconds, events=len(messages), cpu=cpu)


async def audit(topology: Topology, events: int) -> int:
    """What the broker holds, once it equals ``events`` or ``COUNT_SETTLE_S`` have passed."""
    deadline = time.monotonic() + COUNT_SETTLE_S
    while True:
        stored = await topology.stored()
        if stored == events or time.monotonic() > deadline:
            return stored
        await asyncio.sleep(0.2)


def per_event_us(seconds: float | None, events: int) -> float | None:
    return None if seconds is None else round(1e6 * seconds / events, 1)


async def measure_broker(
    broker: str, redis: Redis, ledger: Ledger, redis_pid: int | None, *, stream: str,
    messages: list[Message], args: argparse.Namespace, failures: list[str],
) -> dict[str, Any]:  # fmt: skip
    url = broker_url(broker, args)
    broker_pid = listening_pid(url, DEFAULT_PORTS[broker])
    pids = {"broker": broker_pid, "redis": redis_pid}
    events = len(messages)
    runs: dict[str, Run] = {}
    stored: dict[str, int] = {}
    for kind in ("bridge", "raw"):
        topology = new_topology(broker, args)
        sink = await opened(topology.sink(), broker)
        try:
            load = os.getloadavg()[0]
            if kind == "bridge":
                runs[kind] = await run_bridge(
                    redis, ledger, sink, stream=stream, events=events,
                    batch_size=args.batch_size, pids=pids,
                )  # fmt: skip
            else:
                runs[kind] = await run_raw(sink, messages, batch_size=args.batch_size, pids=pids)
            stored[kind] = await audit(topology, events)
        finally:
            await sink.close()
            try:
                await topology.delete()
            except Exception as exc:  # the figures still count; the leftover is named
                print(f"{broker}: could not delete the run's topology: {exc!r}")
        run = runs[kind]
        ok = run.events == events and stored[kind] == events
        if not ok:
            failures.append(
                f"{broker} {kind}: {run.events} confirmed and {stored[kind]} held, "
                f"expected {events}"
            )
        rate = round(events / run.seconds, 1)  # as the JSON says it
        print(
            f"{broker:<8} {kind:<6} {run.seconds:6.2f} s  {rate:>9,.0f} events/s  "
            f"held {stored[kind]}/{events} {'ok' if ok else 'FAILED'}  (load {load:.1f})"
        )
    bridge, raw = runs["bridge"], runs["raw"]
    bridge_rate, raw_rate = events / bridge.seconds, events / raw.seconds
    known = broker_pid is not None
    return {
        "events_per_s": round(bridge_rate, 1),
        "bridge_cpu_us_per_event": per_event_us(bridge.cpu["client"], events),
        "broker_cpu_us_per_event": per_event_us(bridge.cpu["broker"] if known else None, events),
        "redis_cpu_us_per_event": per_event_us(bridge.cpu["redis"] if redis_pid else None, events),
        "raw_events_per_s": round(raw_rate, 1),
        "raw_client_cpu_us_per_event": per_event_us(raw.cpu["client"], events),
        "raw_broker_cpu_us_per_event": per_event_us(raw.cpu["broker"] if known else None, events),
        "ratio": round(bridge_rate / raw_rate, 3),
        "stored": stored["bridge"],
        "raw_stored": stored["raw"],
        "broker_process": process_name(broker_pid),
    }


# -- purchase to message ---------------------------------------------------------------------------


LATENCY_SETTLE_S = 30.0  # after the last purchase, how long the messages may take to arrive


async def measure_latency(
    broker: str, redis: Redis, engine: RedisEngine, ledger: Ledger, *, worker_id: int,
    args: argparse.Namespace, failures: list[str],
) -> dict[str, Any]:  # fmt: skip
    """Purchases at a steady rate with a persister and a bridge running: each one's time from
    its answer to its ``reserved`` message at a consumer of the run's topology."""
    orders = args.latency_orders
    topology = new_topology(broker, args)
    sink = await opened(topology.sink(), broker)
    item_id = await new_item(engine, ledger, total=orders)
    stream = engine.keys(item_id).events
    arrived: dict[int, float] = {}
    all_arrived = asyncio.Event()

    def on_body(body: bytes) -> None:
        event = json.loads(body)
        if event["item_id"] == item_id and event["event"] == "reserved":
            arrived.setdefault(int(event["order_id"]), time.perf_counter())
            if len(arrived) >= orders:
                all_arrived.set()

    stop = asyncio.Event()
    persister = Persister(redis=redis, ledger=ledger, prefix=DEFAULT_PREFIX, stop=stop)
    bridge = Bridge(
        redis=redis, ledger=ledger, sink=sink, prefix=DEFAULT_PREFIX, consumer="bench-latency",
        stop=stop,
    )  # fmt: skip
    load = os.getloadavg()[0]
    try:
        async with topology.consuming(on_body):
            workers = [
                asyncio.create_task(run_until_stopped(worker, stop))
                for worker in (persister, bridge)
            ]
            try:
                # Both groups on the item's stream before the first purchase (each reader finds
                # a new item within a second): a sale starts with its sinks running.
                wanted = {GROUP, bridge.group}
                deadline = time.monotonic() + 10
                while not wanted <= {g["name"] for g in await redis.xinfo_groups(stream)}:
                    if time.monotonic() > deadline:
                        sys.exit(f"{broker}: the workers did not find item {item_id} in 10 s")
                    await asyncio.sleep(0.05)
                answered = await buy_steadily(engine, item_id, orders, args.latency_rate, worker_id)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_arrived.wait(), LATENCY_SETTLE_S)
            finally:
                stop.set()
                await asyncio.gather(*workers)
                # Out of the registry, as archiving takes an item: the next broker's bridge
                # would otherwise find this sale and forward it while its own is timed.
                await redis.srem(items_registry(DEFAULT_PREFIX), item_id)
    finally:
        await sink.close()
        try:
            await topology.delete()
        except Exception as exc:
            print(f"{broker}: could not delete the run's topology: {exc!r}")
    latencies = sorted(1000 * (arrived[o] - answered[o]) for o in answered if o in arrived)
    if len(answered) != orders or len(latencies) != orders:
        failures.append(
            f"{broker} latency: {len(answered)} purchases answered, {len(latencies)} of them "
            f"delivered, expected {orders}"
        )
    figures = {
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
        "max": round(latencies[-1], 1) if latencies else None,
    }
    print(
        f"{broker:<8} latency {orders} purchases at {args.latency_rate:g}/s: purchase to message "
        f"p50 {figures['p50']} ms, p99 {figures['p99']} ms, max {figures['max']} ms  "
        f"(load {load:.1f})"
    )
    return figures


async def buy_steadily(
    engine: RedisEngine, item_id: int, orders: int, rate: float, worker_id: int
) -> dict[int, float]:
    """``orders`` purchases, one every ``1 / rate`` s (each its own task, so a slow answer does
    not hold the next back); each reserved order's answer time."""
    ids = OrderIds(worker_id=worker_id)
    answered: dict[int, float] = {}

    async def buy(n: int, order_id: int) -> None:
        reservation = await engine.reserve(
            item_id, buyer=f"l{n}", quantity=1, idempotency_key=f"l{n}", order_id=order_id
        )
        if reservation.outcome is Outcome.RESERVED:
            answered[order_id] = time.perf_counter()

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for n in range(orders):
            wait = started + n / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            group.create_task(buy(n, ids.next()))
    return answered


async def opened(sink: Sink, broker: str) -> Sink:
    """``sink`` connected and declared before the clock starts, as a running worker's sink is;
    the run ends here if the broker cannot be used."""
    try:
        await sink.open()
    except SinkUnavailable as exc:
        sys.exit(f"{broker} cannot be used: {exc}")
    return sink


def table(results: dict[str, Any], brokers: Sequence[str]) -> None:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}"

    print(
        f"\n{'broker':<9}{'events/s':>10}{'raw/s':>10}{'ratio':>7}"
        f"{'bridge us/ev':>14}{'broker us/ev':>14}{'redis us/ev':>13}"
        f"{'raw client us/ev':>18}{'raw broker us/ev':>18}{'p50 ms':>8}{'p99 ms':>8}"
    )
    for broker in brokers:
        r = results[broker]
        print(
            f"{broker:<9}{r['events_per_s']:>10,.0f}{r['raw_events_per_s']:>10,.0f}"
            f"{r['ratio']:>7.3f}{cell(r['bridge_cpu_us_per_event']):>14}"
            f"{cell(r['broker_cpu_us_per_event']):>14}{cell(r['redis_cpu_us_per_event']):>13}"
            f"{cell(r['raw_client_cpu_us_per_event']):>18}"
            f"{cell(r['raw_broker_cpu_us_per_event']):>18}"
            f"{cell(r['latency_ms']['p50']):>8}{cell(r['latency_ms']['p99']):>8}"
        )


async def measure(
    server: RedisServer, ledger: Ledger, args: argparse.Namespace
) -> tuple[dict[str, Any], bool]:
    pool = BlockingConnectionPool.from_url(
        server.url, decode_responses=True, max_connections=CONCURRENCY
    )
    redis = Redis.from_pool(pool)
    try:
        scripts = Scripts(redis)
        await scripts.load()
        engine = RedisEngine(
            redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS, prefix=DEFAULT_PREFIX
        )
        item_id = await new_item(engine, ledger, total=args.orders)
        stream = engine.keys(item_id).events
        # Every broker's group from the stream's start: one bridge trimming what its group has
        # acknowledged leaves what the next one's still needs.
        for broker in args.brokers:
            await redis.xgroup_create(stream, bridge_group(broker), id="0")
        started = time.perf_counter()
        outcomes = await build_backlog(engine, item_id, args.orders)
        backlog_s = time.perf_counter() - started
        paid = (args.orders + 1) // 2
        expected = Counter({Outcome.RESERVED.value: args.orders, Outcome.PAID.value: paid})
        if outcomes != expected:
            sys.exit(f"backlog check failed: expected {dict(expected)}, got {dict(outcomes)}")
        started = time.perf_counter()
        await land(redis, ledger, stream)
        landed_s = time.perf_counter() - started
        messages = await stream_messages(redis, stream)
        events = len(messages)
        print(
            f"backlog: {args.orders} reservations and {paid} payments in {backlog_s:.1f} s, "
            f"landed in {landed_s:.1f} s: {events} order events ({await redis.xlen(stream)} "
            f"stream entries); batch {args.batch_size}; {os.cpu_count()} CPUs"
        )
        redis_pid = server.process.pid if server.process else None
        results: dict[str, Any] = {
            "orders": args.orders, "events": events, "batch_size": args.batch_size,
            "latency_orders": args.latency_orders, "latency_rate": args.latency_rate,
        }  # fmt: skip
        failures: list[str] = []
        for broker in args.brokers:
            results[broker] = await measure_broker(
                broker, redis, ledger, redis_pid, stream=stream, messages=messages, args=args,
                failures=failures,
            )  # fmt: skip
            if results[broker]["broker_process"] is None:
                print(f"{broker:<8} no server process found listening at its port: CPU null")
        for n, broker in enumerate(args.brokers):  # after every backlog run: items of their own
            results[broker]["latency_ms"] = await measure_latency(
                broker, redis, engine, ledger, worker_id=2 + n, args=args, failures=failures
            )
    finally:
        await redis.aclose()
    table(results, args.brokers)
    for failure in failures:
        print(f"audit FAILED: {failure}")
    results["audit"] = "failed" if failures else "ok"
    return results, not failures


async def measure_with_database(
    server: RedisServer, args: argparse.Namespace, directory: Path
) -> tuple[dict[str, Any], bool]:
    database = open_database(args.database_url or f"sqlite+aiosqlite:///{directory / 'bench.db'}")
    try:
        await upgrade(database)
        return await measure(server, Ledger(database), args)
    finally:
        await database.dispose()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="seckill-bench-bridge-") as directory,
        RedisServer(binary=redis_binary(args.redis_server), port=free_port()) as server,
    ):
        result, ok = asyncio.run(measure_with_database(server, args, Path(directory)))
    print(json.dumps(result))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
