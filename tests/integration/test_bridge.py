"""The bridge end to end, on each real broker: every event of a sale reaches a consumer exactly
once after dedup by message id, each order's events in their order; the stream is acknowledged
only once the broker confirmed; a bridge killed mid-publish loses nothing."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import nats
import pytest

from seckill.domain.events import EventKind, ReleaseReason
from seckill.engine.engine import RedisEngine
from seckill.engine.streams import GROUP, read_progress
from seckill.services.dead_letters import (
    drop_dead_letters,
    list_dead_letters,
    replay_dead_letters,
)
from seckill.sinks import Sink, sink_from_url
from seckill.sinks.nats import DEFAULT_STREAM, DEFAULT_SUBJECT_PREFIX
from seckill.store.ledger import Ledger
from seckill.workers.bridge import Bridge, BridgeConfig
from seckill.workers.loop import run_until_stopped
from tests.brokers import BROKERS, Broker, Delivery, Nats, free_port, sink_of
from tests.conftest import RedisTarget, open_item, pay
from tests.polling import wait_until

pytestmark = pytest.mark.redis_variants("redis7", "cluster")

QUICK = BridgeConfig(block_ms=50, poll_ms=10, claim_idle_ms=500)


async def sell(
    engine: RedisEngine, orders: int, *, first_order: int = 1
) -> dict[int, list[EventKind]]:
    """A sale of ``orders`` orders (the item loaded with the first): every other one paid,
    every fourth released; each order's events, in their order."""
    if first_order == 1:
        await engine.load_item(open_item(total=100_000))
    expected: dict[int, list[EventKind]] = defaultdict(list)

    async def one(n: int) -> None:
        await engine.reserve(1, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=n)
        expected[n].append(EventKind.RESERVED)
        if n % 2 == 0:
            await pay(engine, 1, n)
            expected[n].append(EventKind.PAID)
        elif n % 4 == 1:
            await engine.release(1, n, ReleaseReason.CANCELLED)
            expected[n].append(EventKind.RELEASED)

    last = first_order + orders
    for first in range(first_order, last, 100):
        await asyncio.gather(*(one(n) for n in range(first, min(first + 100, last))))
    return expected


def order_events(got: list[Delivery]) -> tuple[dict[int, list[str]], int]:
    """Each order's events as received once deduplicated by message id, in arrival order, and
    how many copies were dropped (a copy must be the same message: same body)."""
    seen: dict[str, bytes] = {}
    per_order: dict[int, list[str]] = defaultdict(list)
    copies = 0
    for delivery in got:
        if delivery.message_id in seen:
            assert seen[delivery.message_id] == delivery.body, delivery.message_id
            copies += 1
            continue
        seen[delivery.message_id] = delivery.body
        body = json.loads(delivery.body)
        per_order[int(body["order_id"])].append(body["event"])
    return per_order, copies


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out)


async def backlog(engine: RedisEngine, group: str) -> int:
    (progress,) = await read_progress(engine.redis, [engine.keys(1).events])
    return progress.of(group).backlog


async def drained(engine: RedisEngine, group: str) -> bool:
    return await backlog(engine, group) == 0


async def received_from_nats(url: str, count: int) -> list[Delivery]:
    """What a consumer of the bridge's default stream on that server gets."""
    client = await nats.connect(url)
    try:
        consumer = Nats(client)
        consumer.stream, consumer.prefix = DEFAULT_STREAM, DEFAULT_SUBJECT_PREFIX
        return await consumer.received(count)
    finally:
        await client.close()


async def pending(engine: RedisEngine, group: str) -> int:
    (progress,) = await read_progress(engine.redis, [engine.keys(1).events])
    return progress.of(group).pending


async def test_every_event_of_a_sale_reaches_a_consumer_once_in_order(
    engine: RedisEngine, broker: Broker, sinks: list[Sink]
) -> None:
    expected = await sell(engine, 1000)
    events = sum(len(kinds) for kinds in expected.values())
    bridge = Bridge(
        redis=engine.redis, sink=sink_of(broker, sinks), prefix=engine.prefix, config=QUICK
    )
    deadline = time.monotonic() + 60
    while bridge.forwarded < events and time.monotonic() < deadline:
        await bridge.run_once()
    assert bridge.forwarded == events
    assert await backlog(engine, bridge.group) == 0

    per_order, copies = order_events(await broker.received(events))
    assert copies == 0
    assert per_order == {n: [str(k) for k in kinds] for n, kinds in expected.items()}


@pytest.mark.slow
@pytest.mark.redis_variants("redis7")
async def test_a_bridge_killed_mid_publish_loses_nothing(
    engine: RedisEngine, redis_server: RedisTarget, broker: Broker, tmp_path: Path
) -> None:
    """kill -9 of the bridge process while it publishes, again and again: every event arrives,
    and any copy is one with an id already seen."""
    expected = await sell(engine, 4000)
    events = sum(len(kinds) for kinds in expected.values())
    topology = json.dumps(broker.names())
    argv = [sys.executable, "-m", "tests.bridge_process", redis_server.url, broker.url(), topology]
    group = f"bridge-{broker.name}"
    rng = random.Random(5)
    killed_mid_sale = 0
    for cycle in range(20):
        before = await backlog(engine, group)
        child = start(argv, tmp_path / f"bridge-{cycle}.log")

        async def forwarding(before: int = before) -> bool:
            return await backlog(engine, group) < before or await pending(engine, group) > 0

        await wait_until(forwarding, 30, "a bridge process forwarding")
        await asyncio.sleep(rng.uniform(0, 0.02))  # somewhere in a batch's publish
        child.send_signal(signal.SIGKILL)
        await asyncio.to_thread(child.wait)
        left = await backlog(engine, group)
        if left == 0:
            break
        killed_mid_sale += 1
    assert killed_mid_sale >= 15, f"only {killed_mid_sale} kills came before the end"
    # The last one is left to finish (under the same consumer name: what its predecessors had
    # read and not acknowledged comes first).
    child = start(argv, tmp_path / "bridge-last.log")
    try:

        async def drained() -> bool:
            return await backlog(engine, group) == 0

        await wait_until(drained, 60, "the last bridge forwarding the rest")
    finally:
        child.send_signal(signal.SIGTERM)
        await asyncio.to_thread(child.wait, 20)
    got = await broker.received(events)
    per_order, copies = order_events(got)
    assert per_order.keys() == expected.keys()
    for order_id, kinds in expected.items():
        # A copy may arrive after a later event of its order; the first time each arrived keeps
        # the order's sequence.
        assert per_order[order_id] == [str(k) for k in kinds], order_id
    assert len(got) == events + copies


class OwnNatsServer:
    """A nats-server with JetStream that this test starts, stops and starts again, on its own
    port and store (never the machine's shared one)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.directory / "store")]  # fmt: skip
        self.process = start(argv, self.directory / "nats.log")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(20)
            self.process = None


@pytest.mark.redis_variants("redis7")
async def test_a_broker_down_mid_sale_loses_nothing_and_the_backlog_drains(
    engine: RedisEngine, tmp_path: Path
) -> None:
    """The broker stops mid-sale: buying goes on, the events wait in the stream, and once it is
    back every one is delivered."""
    server = OwnNatsServer(tmp_path)
    server.start()
    sink = sink_from_url(server.url, connect_timeout_s=0.5, confirm_timeout_s=1.0)
    bridge = Bridge(redis=engine.redis, sink=sink, prefix=engine.prefix, config=QUICK)
    stop = asyncio.Event()
    forwarding = asyncio.create_task(run_until_stopped(bridge, stop))
    try:
        first = await sell(engine, 300)
        await wait_until(lambda: drained(engine, bridge.group), 30, "the first orders forwarded")
        server.stop()
        more = await sell(engine, 300, first_order=301)  # the broker is down
        await asyncio.sleep(1.5)  # a few failed publishes and pauses
        assert await backlog(engine, bridge.group) > 0  # waiting in the stream, not lost
        server.start()
        await wait_until(lambda: drained(engine, bridge.group), 30, "the backlog drained")
    finally:
        stop.set()
        await forwarding
        await sink.close()
    expected = {**first, **more}
    events = sum(len(kinds) for kinds in expected.values())
    got = await received_from_nats(server.url, events)
    server.stop()
    per_order, _ = order_events(got)
    assert per_order == {n: [str(k) for k in kinds] for n, kinds in expected.items()}


@pytest.mark.redis_variants("redis7")
async def test_letters_the_broker_refused_are_delivered_once_it_takes_them_or_dropped(
    engine: RedisEngine, ledger: Ledger, broker: Broker, sinks: list[Sink]
) -> None:
    await engine.load_item(open_item(total=100))
    for n in (1, 2, 3):
        await engine.reserve(1, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=n)
    full = await broker.limit(capacity=1)  # takes the first message, refuses the others
    sinks.append(full)
    bridge = Bridge(
        redis=engine.redis, sink=full, prefix=engine.prefix,
        config=replace(QUICK, max_deliveries=1),
    )  # fmt: skip
    while not await drained(engine, bridge.group):
        await bridge.run_once()
    assert (bridge.forwarded, bridge.dead_lettered) == (1, 2)
    first, second = letters = await list_dead_letters(ledger, engine, group=bridge.group)
    assert all(letter.pending and letter.deliveries == 1 for letter in letters)
    assert await list_dead_letters(ledger, engine, group=GROUP) == []

    # Still full: a replay is refused, and the letter stays.
    refused = await replay_dead_letters(ledger, engine, [first.id], sink=full)
    assert [letter.refused for letter in refused.letters] != [None]
    assert len(await list_dead_letters(ledger, engine)) == 2
    (taken,) = await broker.received(1)

    # The operator gives the broker room (here: another topology, with no limit).
    roomy = await BROKERS[broker.name]()
    try:
        replayed = await replay_dead_letters(ledger, engine, [first.id], sink=sink_of(roomy, sinks))
        assert replayed.ok, replayed
        (delivered,) = await roomy.received(1)
    finally:
        await roomy.cleanup()
    assert json.loads(delivered.body)["order_id"] == first.payload["order_id"]
    assert delivered.message_id != taken.message_id
    again = await replay_dead_letters(ledger, engine, [first.id], sink=full)
    assert again.missing == [first.id]

    assert (await drop_dead_letters(ledger, engine, [second.id])).ok
    assert await list_dead_letters(ledger, engine) == []
    assert await engine.redis.xlen(engine.keys(1).dead_letters) == 0
