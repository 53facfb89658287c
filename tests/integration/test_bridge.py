"""The bridge end to end, on each real broker: every event of a sale reaches a consumer exactly
once after dedup by message id, each order's events in their order; the stream is acknowledged
only once the broker confirmed; a bridge killed mid-publish loses nothing; and an event is
published only once SQL has landed it, so one Redis loses before it lands is never published,
and a bridge down across a total loss of Redis gets every landed event back from recovery."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from seckill.domain.events import EventKind, ReleaseReason
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import item_pattern
from seckill.engine.streams import GROUP, read_progress
from seckill.redis_cluster import LocalCluster
from seckill.services.dead_letters import (
    drop_dead_letters,
    list_dead_letters,
    replay_dead_letters,
)
from seckill.services.items import warm_item
from seckill.services.reconcile.recovery import recover_item
from seckill.sinks import Sink, sink_from_url
from seckill.sinks.nats import DEFAULT_STREAM, DEFAULT_SUBJECT_PREFIX
from seckill.store.ledger import Ledger
from seckill.workers.bridge import Bridge, BridgeConfig
from seckill.workers.loop import run_until_stopped
from seckill.workers.persister import Persister, PersisterConfig
from tests.conftest import RedisTarget, flush, new_item, open_item, pay
from tests.support.brokers import BROKERS, Broker, Delivery, Nats, free_port, sink_of
from tests.support.polling import wait_until

pytestmark = pytest.mark.redis_variants("redis7", "cluster")

QUICK = BridgeConfig(block_ms=50, poll_ms=10, claim_idle_ms=500)
LANDING = PersisterConfig(block_ms=50, poll_ms=10, claim_idle_ms=500, trim_every_s=0.2)


@pytest.fixture
async def item_id(engine: RedisEngine, ledger: Ledger) -> int:
    """An item on sale, in SQL and in Redis (an item SQL lacks has nothing to publish)."""
    item_id = await ledger.create_item(new_item(total=100_000))
    await warm_item(engine, ledger, item_id)
    return item_id


def persister(engine: RedisEngine, ledger: Ledger, **config: Any) -> Persister:
    return Persister(
        redis=engine.redis, ledger=ledger, prefix=engine.prefix, config=replace(LANDING, **config)
    )


async def following(engine: RedisEngine, item_id: int, group: str) -> None:
    """Wait until ``group`` is on the item's stream: a bridge is started before the sale, or the
    persister may trim what it has landed before the bridge has found the stream."""

    async def there() -> bool:
        groups = await engine.redis.xinfo_groups(engine.keys(item_id).events)
        return group in {g["name"] for g in groups}

    await wait_until(there, 10, f"{group} on the item's stream")


async def land(engine: RedisEngine, ledger: Ledger, item_id: int) -> None:
    """Run a persister until SQL has the item's whole stream."""
    landing = persister(engine, ledger)
    async with asyncio.timeout(60):
        while await backlog(engine, GROUP, item_id):
            await landing.run_once()


async def sell(
    engine: RedisEngine, item_id: int, orders: int, *, first_order: int = 1
) -> dict[int, list[EventKind]]:
    """A sale of ``orders`` orders: every other one paid, every fourth released; each order's
    events, in their order."""
    expected: dict[int, list[EventKind]] = defaultdict(list)

    async def one(n: int) -> None:
        await engine.reserve(item_id, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=n)
        expected[n].append(EventKind.RESERVED)
        if n % 2 == 0:
            await pay(engine, item_id, n)
            expected[n].append(EventKind.PAID)
        elif n % 4 == 1:
            await engine.release(item_id, n, ReleaseReason.CANCELLED)
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


async def backlog(engine: RedisEngine, group: str, item_id: int) -> int:
    (progress,) = await read_progress(engine.redis, [engine.keys(item_id).events])
    return progress.of(group).backlog


async def drained(engine: RedisEngine, group: str, item_id: int) -> bool:
    return await backlog(engine, group, item_id) == 0


async def received_from_nats(url: str, count: int) -> list[Delivery]:
    """What a consumer of the bridge's default stream on that server gets."""
    client = await nats.connect(url)
    try:
        consumer = Nats(client)
        consumer.stream, consumer.prefix = DEFAULT_STREAM, DEFAULT_SUBJECT_PREFIX
        return await consumer.received(count)
    finally:
        await client.close()


async def pending(engine: RedisEngine, group: str, item_id: int) -> int:
    (progress,) = await read_progress(engine.redis, [engine.keys(item_id).events])
    return progress.of(group).pending


def count(expected: dict[int, list[EventKind]]) -> int:
    return sum(len(kinds) for kinds in expected.values())


def as_received(expected: dict[int, list[EventKind]]) -> dict[int, list[str]]:
    return {n: [str(k) for k in kinds] for n, kinds in expected.items()}


async def test_every_event_of_a_sale_reaches_a_consumer_once_in_order(
    engine: RedisEngine, ledger: Ledger, item_id: int, broker: Broker, sinks: list[Sink]
) -> None:
    """The persister and the bridge take turns: each pass publishes what has landed since."""
    bridge = Bridge(
        redis=engine.redis, ledger=ledger, sink=sink_of(broker, sinks), prefix=engine.prefix,
        config=QUICK,
    )  # fmt: skip
    await bridge.run_once()  # started before the sale
    expected = await sell(engine, item_id, 1000)
    events = count(expected)
    landing = persister(engine, ledger, batch_size=300)
    async with asyncio.timeout(60):
        while bridge.forwarded < events:
            await landing.run_once()
            await bridge.run_once()
    assert await backlog(engine, bridge.group, item_id) == 0

    per_order, copies = order_events(await broker.received(events))
    assert copies == 0
    assert per_order == as_received(expected)


@pytest.mark.slow
@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)  # a file both processes open
async def test_a_bridge_killed_mid_publish_loses_nothing(
    engine: RedisEngine, ledger: Ledger, item_id: int, sql_url: str, redis_server: RedisTarget,
    broker: Broker, tmp_path: Path,
) -> None:  # fmt: skip
    """kill -9 of the bridge process while it publishes, again and again: every event arrives,
    and any copy is one with an id already seen."""
    group = f"bridge-{broker.name}"
    await engine.redis.xgroup_create(engine.keys(item_id).events, group, id="0")
    expected = await sell(engine, item_id, 4000)
    events = count(expected)
    await land(engine, ledger, item_id)
    topology = json.dumps(broker.names())
    argv = [sys.executable, "-m", "tests.support.bridge_process", redis_server.url, sql_url,
            broker.url(), topology]  # fmt: skip
    rng = random.Random(5)
    killed_mid_sale = 0
    for cycle in range(20):
        before = await backlog(engine, group, item_id)
        child = start(argv, tmp_path / f"bridge-{cycle}.log")

        async def forwarding(before: int = before) -> bool:
            return (
                await backlog(engine, group, item_id) < before
                or await pending(engine, group, item_id) > 0
            )

        await wait_until(forwarding, 30, "a bridge process forwarding")
        await asyncio.sleep(rng.uniform(0, 0.02))  # somewhere in a batch's publish
        child.send_signal(signal.SIGKILL)
        await asyncio.to_thread(child.wait)
        left = await backlog(engine, group, item_id)
        if left == 0:
            break
        killed_mid_sale += 1
    assert killed_mid_sale >= 15, f"only {killed_mid_sale} kills came before the end"
    # The last one is left to finish (under the same consumer name: what its predecessors had
    # read and not acknowledged comes first).
    child = start(argv, tmp_path / "bridge-last.log")
    try:
        await wait_until(
            lambda: drained(engine, group, item_id), 60, "the last bridge forwarding the rest"
        )
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
@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_a_broker_down_mid_sale_loses_nothing_and_the_backlog_drains(
    engine: RedisEngine, ledger: Ledger, item_id: int, tmp_path: Path
) -> None:
    """The broker stops mid-sale: buying goes on, the events wait in the stream, and once it is
    back every one is delivered."""
    server = OwnNatsServer(tmp_path)
    server.start()
    sink = sink_from_url(server.url, connect_timeout_s=0.5, confirm_timeout_s=1.0)
    bridge = Bridge(
        redis=engine.redis, ledger=ledger, sink=sink, prefix=engine.prefix, config=QUICK
    )
    stop = asyncio.Event()
    workers = [
        asyncio.create_task(run_until_stopped(worker, stop))
        for worker in (bridge, persister(engine, ledger))
    ]
    try:
        await following(engine, item_id, bridge.group)
        first = await sell(engine, item_id, 300)
        await wait_until(
            lambda: drained(engine, bridge.group, item_id), 30, "the first orders forwarded"
        )
        server.stop()
        more = await sell(engine, item_id, 300, first_order=301)  # the broker is down
        await asyncio.sleep(1.5)  # a few failed publishes and pauses
        assert await backlog(engine, bridge.group, item_id) > 0  # waiting in the stream
        server.start()
        await wait_until(lambda: drained(engine, bridge.group, item_id), 30, "the backlog drained")
    finally:
        stop.set()
        await asyncio.gather(*workers)
        await sink.close()
    expected = {**first, **more}
    got = await received_from_nats(server.url, count(expected))
    server.stop()
    per_order, _ = order_events(got)
    assert per_order == as_received(expected)


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_letters_the_broker_refused_are_delivered_once_it_takes_them_or_dropped(
    engine: RedisEngine, ledger: Ledger, item_id: int, broker: Broker, sinks: list[Sink]
) -> None:
    full = await broker.limit(capacity=1)  # takes the first message, refuses the others
    sinks.append(full)
    bridge = Bridge(
        redis=engine.redis, ledger=ledger, sink=full, prefix=engine.prefix,
        config=replace(QUICK, max_deliveries=1),
    )  # fmt: skip
    await bridge.run_once()
    for n in (1, 2, 3):
        await engine.reserve(item_id, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=n)
    await land(engine, ledger, item_id)
    while not await drained(engine, bridge.group, item_id):
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
    assert await engine.redis.xlen(engine.keys(item_id).dead_letters) == 0


# -- what SQL has is what is published -------------------------------------------------------------


def raw_client(target: RedisTarget) -> Redis | RedisCluster:
    """A client that reads bytes, for DUMP and RESTORE."""
    if isinstance(target, LocalCluster):
        return RedisCluster.from_url(target.url)
    return Redis.from_url(target.url)


async def item_state(raw: Redis | RedisCluster, item_id: int, prefix: str) -> dict[bytes, Any]:
    """Every key of the item, serialized by Redis itself (its stream with its groups and their
    pending entries)."""
    keys = [key async for key in raw.scan_iter(match=item_pattern(item_id, prefix))]
    return {key: await raw.dump(key) for key in keys}


async def go_back_to(
    raw: Redis | RedisCluster, state: dict[bytes, Any], item_id: int, prefix: str
) -> None:
    """The item as it was when ``state`` was taken: what Redis holds after a restart from an
    older AOF, or once a replica that lagged behind is promoted."""
    for key in [key async for key in raw.scan_iter(match=item_pattern(item_id, prefix))]:
        if key not in state:
            await raw.delete(key)
    for key, value in state.items():
        await raw.restore(key, 0, value, replace=True)


async def test_an_event_redis_loses_before_it_lands_is_never_published(
    engine: RedisEngine, ledger: Ledger, item_id: int, redis_server: RedisTarget,
    broker: Broker, sinks: list[Sink],
) -> None:  # fmt: skip
    """Orders bought while the persister is stopped are read by the bridge and wait, pending;
    then Redis goes back to before them (an older AOF, a lagging replica promoted), and they
    are gone on both sides. The bridge never published one. What SQL landed before and after
    reaches the broker once, each order's events in their order."""
    bridge = Bridge(
        redis=engine.redis, ledger=ledger, sink=sink_of(broker, sinks), prefix=engine.prefix,
        config=QUICK,
    )  # fmt: skip
    await bridge.run_once()  # its group on the item's stream, as before a sale
    landed_before = await sell(engine, item_id, 200)
    await land(engine, ledger, item_id)
    async with asyncio.timeout(30):
        while bridge.forwarded < count(landed_before):
            await bridge.run_once()
    raw = raw_client(redis_server)
    try:
        before = await item_state(raw, item_id, engine.prefix)
        lost = await sell(engine, item_id, 200, first_order=201)  # the persister is stopped
        for _ in range(5):
            await bridge.run_once()
        assert bridge.forwarded == count(landed_before)
        assert await pending(engine, bridge.group, item_id) > 0  # read: waiting for SQL
        await go_back_to(raw, before, item_id, engine.prefix)
    finally:
        await raw.aclose()
    for _ in range(3):
        await bridge.run_once()
    assert bridge.forwarded == count(landed_before)
    assert await pending(engine, bridge.group, item_id) == 0  # gone with the stream

    landed_after = await sell(engine, item_id, 200, first_order=401)
    landing = persister(engine, ledger)
    expected = {**landed_before, **landed_after}
    async with asyncio.timeout(60):
        while bridge.forwarded < count(expected):
            await landing.run_once()
            await bridge.run_once()
    assert not lost.keys() & (await ledger.orders(item_id)).keys()  # SQL never had them
    per_order, copies = order_events(await broker.received(count(expected)))
    assert copies == 0
    assert per_order == as_received(expected)


async def test_a_bridge_down_across_a_total_loss_gets_every_landed_event_from_recovery(
    engine: RedisEngine, ledger: Ledger, item_id: int, broker: Broker, sinks: list[Sink]
) -> None:
    """The bridge stops mid-sale; the sale goes on and lands; its last orders have not landed
    when Redis loses everything (restarted empty: FLUSHALL here). Recovery (``seckill
    recover``) makes the bridge's group again, from SQL's registry, before it gives the landed
    events back, so the persister, acknowledging them and trimming, cannot drop them first: the
    bridge, back, publishes every order event SQL landed, and none it lacks."""
    sink = sink_of(broker, sinks)
    bridge = Bridge(
        redis=engine.redis, ledger=ledger, sink=sink, prefix=engine.prefix, consumer="host",
        config=QUICK,
    )  # fmt: skip
    await bridge.run_once()
    published = await sell(engine, item_id, 100)
    await land(engine, ledger, item_id)
    async with asyncio.timeout(30):
        while bridge.forwarded < count(published):
            await bridge.run_once()
    # The bridge is down from here.
    unpublished = await sell(engine, item_id, 100, first_order=101)
    await land(engine, ledger, item_id)
    lost = await sell(engine, item_id, 100, first_order=201)  # not landed yet
    await flush(engine.redis)  # Redis comes back with nothing

    await recover_item(engine, ledger, item_id)
    landing = persister(engine, ledger)
    async with asyncio.timeout(30):
        while await backlog(engine, GROUP, item_id):
            await landing.run_once()
    await landing.trim()  # everything every group on the stream is done with

    back = Bridge(
        redis=engine.redis, ledger=ledger, sink=sink, prefix=engine.prefix, consumer="host",
        config=QUICK,
    )  # fmt: skip
    async with asyncio.timeout(60):
        while True:
            await back.run_once()
            if await drained(engine, back.group, item_id):
                break
    expected = {**published, **unpublished}
    assert not lost.keys() & (await ledger.orders(item_id)).keys()
    got = await broker.received(count(expected) + count(published))
    per_order, _ = order_events(got)
    assert per_order == as_received(expected)


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_events_the_persister_set_aside_are_never_published_nor_hold_their_stream(
    engine: RedisEngine, ledger: Ledger, item_id: int, broker: Broker, sinks: list[Sink]
) -> None:
    """An item SQL does not know (loaded into Redis alone): the persister sets aside each of its
    events. The bridge holds their stream until the persister's letters are there, then sets
    each aside too, naming the persister's letter; one a person dropped is acknowledged with no
    letter. Replaying the bridge's letter is refused while SQL lacks the event. The known
    item's events are published as ever."""
    unknown = item_id + 1000
    await engine.load_item(open_item(unknown, total=10))
    for n in (1, 2, 3):
        await engine.reserve(
            unknown, buyer=f"u{n}", quantity=1, idempotency_key="k", order_id=1000 + n
        )
    known = await sell(engine, item_id, 10)
    sink = sink_of(broker, sinks)
    bridge = Bridge(
        redis=engine.redis, ledger=ledger, sink=sink, prefix=engine.prefix,
        config=replace(QUICK, set_aside_check_s=0.1),
    )  # fmt: skip
    for _ in range(3):
        await bridge.run_once()
    assert bridge.forwarded == 0  # nothing landed yet, on either stream
    # Its three reservations wait; its load, no order's event, is done with.
    assert await backlog(engine, bridge.group, unknown) == 3

    landing = persister(engine, ledger, max_deliveries=1)
    async with asyncio.timeout(30):
        while await backlog(engine, GROUP, unknown) or await backlog(engine, GROUP, item_id):
            await landing.run_once()
    set_aside = await list_dead_letters(ledger, engine, group=GROUP)
    reserved = sorted(
        (letter for letter in set_aside if letter.payload.get("event") == "reserved"),
        key=lambda letter: letter.payload["order_id"],
    )
    assert len(reserved) == 3
    assert (await drop_dead_letters(ledger, engine, [reserved[0].id])).ok

    async with asyncio.timeout(30):
        while await backlog(engine, bridge.group, unknown) or await backlog(
            engine, bridge.group, item_id
        ):
            await bridge.run_once()
    assert bridge.forwarded == count(known)
    assert (bridge.dead_lettered, bridge.never_landed) == (2, 1)
    mine = await list_dead_letters(ledger, engine, group=bridge.group)
    assert sorted(letter.payload["order_id"] for letter in mine) == ["1002", "1003"]
    assert all("not in SQL" in letter.error for letter in mine)
    refused = await replay_dead_letters(ledger, engine, [mine[0].id], sink=sink)
    assert refused.letters[0].refused and "not in SQL" in refused.letters[0].refused

    per_order, copies = order_events(await broker.received(count(known)))
    assert copies == 0
    assert per_order == as_received(known)
