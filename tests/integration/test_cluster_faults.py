"""A Redis Cluster losing a master, and moving a live item's slot, in the middle of a sale.

Each test starts its own cluster (3 masters with a replica each, Redis 7) and the API with its
persister, reaper and reconciler on it, over an emptied database (the reconciler rebuilds every
unfinished sale SQL records that a new Redis lacks). Buyers hold their tickets before the sale
and retry a 503 with the same idempotency key, as the answer's Retry-After invites them to. An
item whose slot changed node (a replica promoted, a slot moved) is fenced until the reconciler
has checked it against SQL: its buyers see 503 item_recovering meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from seckill.bootstrap.workers import WorkerKind
from seckill.engine.audit import audit_item
from seckill.engine.cluster import REDIS_UNAVAILABLE, ClusterNodes, ClusterPipeliner
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, item_keys, items_registry
from seckill.engine.scripts import Scripts
from seckill.engine.streams import stream_drained
from seckill.redis_cluster import LocalCluster
from seckill.services.reconcile.reconciler import Reconciler
from seckill.services.reconcile.records import compare_records
from seckill.store.ledger import Ledger
from seckill.workers.reaper import Reaper
from tests.api.conftest import Api, api_settings, running_api
from tests.conftest import ManualClock, open_item, redis7_binary, redis_settings
from tests.support.polling import wait_until

sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

BUYERS = 150  # per item, each buying one unit
RETRY_PAUSE_S = 0.1  # a client honours Retry-After; the test shortens it to keep the sale short
GIVE_UP_S = 45.0  # a buyer still without a final answer by then fails the test
WORKERS = (WorkerKind.PERSISTER, WorkerKind.REAPER, WorkerKind.RECONCILER)


@pytest.fixture
def cluster() -> AsyncIterator[LocalCluster]:
    with LocalCluster(
        masters=3, replicas=1, binary=redis7_binary(), node_timeout_ms=1_000
    ) as running:
        yield running


@dataclass
class Buyer:
    item_id: int
    name: str
    final: int | None = None  # the status that ended the buyer's attempts
    order_id: str | None = None
    unavailable: list[tuple[float, float, str]] = field(default_factory=list)  # (at, s, why)


async def buy_until_answered(api: Api, buyer: Buyer) -> None:
    """Buy once; a 503 (Redis unavailable or not durable) is retried with the same key."""
    give_up = time.monotonic() + GIVE_UP_S
    while time.monotonic() < give_up:
        sent = time.monotonic()
        answer = await api.buy(buyer.item_id, buyer.name, f"key-{buyer.name}")
        if answer.status_code != 503:
            assert answer.status_code < 500, answer.text
            buyer.final = answer.status_code
            if answer.status_code == 202:
                buyer.order_id = answer.json()["order_id"]
            return
        assert answer.headers.get("Retry-After"), answer.text
        buyer.unavailable.append((sent, time.monotonic() - sent, answer.text))
        await asyncio.sleep(RETRY_PAUSE_S)
    pytest.fail(f"{buyer.name} got no answer but 503 for {GIVE_UP_S} s")


async def ticket_until_issued(api: Api, buyer: Buyer) -> None:
    """A ticket; a 503 (the item fenced a moment: its slot just moved) is asked again."""
    give_up = time.monotonic() + GIVE_UP_S
    while time.monotonic() < give_up:
        issued = await api._ticket(buyer.item_id, buyer.name)  # cached from now on
        if isinstance(issued, str):
            return
        assert issued.status_code == 503, issued.text
        await asyncio.sleep(RETRY_PAUSE_S)
    pytest.fail(f"{buyer.name} got no ticket but 503 for {GIVE_UP_S} s")


async def sale(api: Api, buyers: list[Buyer], *, pace_s: float) -> None:
    """The buyers arrive one every ``pace_s`` per item, each buying until answered."""
    for buyer in buyers:  # tickets first: the sale itself is purchases
        await ticket_until_issued(api, buyer)
    by_item: dict[int, list[Buyer]] = {}
    for buyer in buyers:
        by_item.setdefault(buyer.item_id, []).append(buyer)

    async def arrive(line: list[Buyer]) -> None:
        tasks = []
        for buyer in line:
            tasks.append(asyncio.create_task(buy_until_answered(api, buyer)))
            await asyncio.sleep(pace_s)
        await asyncio.gather(*tasks)

    await asyncio.gather(*(arrive(line) for line in by_item.values()))


def owner_port(api: Api, item_id: int) -> int:
    """The port of the master that holds the item."""
    assert isinstance(api.runtime.redis, RedisCluster)
    return owner(api.runtime.redis, item_keys(item_id, DEFAULT_PREFIX).item)


async def one_item_per_master(api: Api, total: int) -> dict[int, int]:
    """Items created until each master holds one: port -> item id."""
    found: dict[int, int] = {}
    while len(found) < 3:
        item_id = await api.create_item(total=total, limit=1, hold_seconds=600)
        found.setdefault(owner_port(api, item_id), item_id)
    return found


async def drained(api: Api, item_ids: list[int]) -> bool:
    """Every stream of the items landed: each stock shard's, not only the head's."""
    redis, engine = api.runtime.redis, api.runtime.engine
    streams = [keys.events for i in item_ids for keys in await engine.shard_keys(i)]
    return all([await stream_drained(redis, stream) for stream in streams])


async def assert_consistent(api: Api, item_ids: list[int]) -> None:
    """Redis's invariants hold and SQL agrees with Redis, order by order, for every item."""
    engine, ledger = api.runtime.engine, api.runtime.ledger
    await wait_until(lambda: drained(api, item_ids), 30, "the persister drained every stream")
    for item_id in item_ids:
        failed = [c for c in await audit_item(engine, item_id, journal=False) if not c.ok]
        failed += [c for c in await compare_records(engine, ledger, item_id) if not c.ok]
        assert not failed, (item_id, failed)
        stock = await engine.stock(item_id)
        assert stock is not None and stock.held + stock.sold <= stock.total


@sqlite_only
@pytest.mark.parametrize("durability", ["fast", "replicas"])
async def test_a_killed_master_fails_only_its_slots_fast_and_they_resume(
    cluster: LocalCluster, ledger: Ledger, sql_url: str, tmp_path: Path, durability: str
) -> None:
    settings = api_settings(
        **redis_settings(cluster), database_url=sql_url, data_dir=tmp_path,
        redis_durability=durability, redis_wait_timeout_ms=500,
        reaper_interval_seconds=0.05, ticket_ttl_seconds=600, fence_check_seconds=0.05,
    )  # fmt: skip
    async with running_api(settings, workers=WORKERS) as api:
        items = await one_item_per_master(api, total=BUYERS * 2)  # never sold out
        victim_port = next(iter(items))
        victim = items[victim_port]
        buyers = [Buyer(i, f"{i}-b{n}") for i in items.values() for n in range(BUYERS)]
        killed_at = promoted_at = 0.0

        async def three_primaries() -> bool:
            return len(await asyncio.to_thread(cluster.primary_ports)) == 3

        async def fail_over() -> None:
            nonlocal killed_at, promoted_at
            await asyncio.sleep(1.0)  # mid-sale
            cluster.node_at(victim_port).kill()
            killed_at = time.monotonic()
            await wait_until(three_primaries, 30, "the killed master's replica took over")
            promoted_at = time.monotonic()
            if durability == "replicas":  # a promoted replica has none: the old master returns
                await asyncio.to_thread(cluster.node_at(victim_port).start)

        await asyncio.gather(sale(api, buyers, pace_s=0.03), fail_over())

        mine = [b for b in buyers if b.item_id == victim]
        others = [b for b in buyers if b.item_id != victim]
        assert Counter(b.final for b in buyers) == {202: len(buyers)}  # everyone, in the end
        assert not [b for b in others if b.unavailable], "other masters' slots kept selling"
        outage = [(sent, took) for b in mine for sent, took, _ in b.unavailable]
        assert outage, "the sale ran through the outage"
        print(
            f"\n{durability}: replica promoted {promoted_at - killed_at:.2f} s after the kill; "
            f"{len(outage)} answers 503 to {sum(bool(b.unavailable) for b in mine)} buyers of "
            f"the killed master's item, the slowest in {max(t for _, t in outage):.2f} s, the "
            f"last sent {max(sent for sent, _ in outage) - killed_at:.2f} s after the kill"
        )

        engine = api.runtime.engine
        answered = {int(b.order_id) for b in mine if b.order_id}
        held = set((await engine.holds(victim)).keys())
        lost = answered - held
        if durability == "replicas":
            assert not lost, f"{len(lost)} reservations answered 202 were lost"
        else:
            # What the old master said yes to and its replica missed: SQL has what landed,
            # and the reconciler rebuilds the item from it.
            reconciler = Reconciler(engine, api.runtime.ledger, grace_ms=60_000)
            await wait_until(lambda: drained(api, [victim]), 30, "the victim's stream drained")
            report = await reconciler.reconcile(victim, repair=True)
            assert not report.left, report.left
            in_sql = set(await api.runtime.ledger.orders(victim))
            recovered = lost & in_sql
            assert in_sql <= set((await engine.holds(victim)).keys())
            print(
                f"fast: {len(lost)} of {len(answered)} reservations answered 202 were not on "
                f"the promoted replica; {len(recovered)} of them had landed in SQL and were "
                f"recovered; {len(lost - recovered)} were lost with the old master "
                f"(their units back on sale)"
            )
        await assert_consistent(api, list(items.values()))


@sqlite_only
async def test_a_live_items_slot_moves_to_another_master_mid_sale(
    cluster: LocalCluster, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    settings = api_settings(
        **redis_settings(cluster), database_url=sql_url, data_dir=tmp_path,
        reaper_interval_seconds=0.05, ticket_ttl_seconds=600, fence_check_seconds=0.05,
    )  # fmt: skip
    async with running_api(settings, workers=WORKERS) as api:
        units = BUYERS * 2 // 3  # sold out before the crowd is through
        item_id = await api.create_item(total=units, limit=1, hold_seconds=600)
        short_hold = await api.create_item(total=10, limit=1, hold_seconds=1)
        source = owner_port(api, item_id)
        target = next(p for p in cluster.primary_ports() if p != source)
        slot = key_slot(item_keys(item_id, DEFAULT_PREFIX).item.encode())
        buyers = [Buyer(item_id, f"b{n}") for n in range(BUYERS)]
        moved = 0

        async def reshard() -> None:
            nonlocal moved
            await asyncio.sleep(0.8)  # mid-sale
            moved = await asyncio.to_thread(cluster.move_slot, slot, target)

        await asyncio.gather(sale(api, buyers, pace_s=0.02), reshard())

        assert moved > 0 and owner_port(api, item_id) == target
        finals = Counter(b.final for b in buyers)
        assert finals == {202: units, 409: BUYERS - units}, finals  # sold exactly the stock
        retries = sum(len(b.unavailable) for b in buyers)
        print(f"\nresharding: {moved} keys moved mid-sale; {retries} answers 503 retried")
        with redis.Redis(port=source) as old_owner:
            left = old_owner.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)  # type: ignore[no-untyped-call]
        assert left == 0, "every key of the item moved with its slot"
        await assert_consistent(api, [item_id])
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and (stock.available, stock.held) == (0, units)

        # The reaper still releases holds after a move: an item's holds expire on their node.
        await asyncio.to_thread(
            cluster.move_slot,
            key_slot(item_keys(short_hold, DEFAULT_PREFIX).item.encode()),
            next(p for p in cluster.primary_ports() if p != owner_port(api, short_hold)),
        )

        async def bought() -> bool:  # fenced a moment after its move, then checked: it sells
            answer = await api.buy(short_hold, "late", "k")
            assert answer.status_code in (202, 503), answer.text
            return answer.status_code == 202

        await wait_until(bought, 10, "the moved item sold again")

        async def released() -> bool:
            stock = await api.runtime.engine.stock(short_hold)
            return stock is not None and stock.held == 0 and stock.available == 10

        await wait_until(released, 10, "the reaper released the moved item's hold")


async def test_the_reaper_reaps_the_live_masters_while_one_is_down(
    cluster: LocalCluster,
) -> None:
    """A master down for good (its replica too: no failover): the items on the live masters
    are reaped at the usual pace, and the pass does not fail for them."""
    client = RedisCluster.from_url(cluster.url, decode_responses=True)
    pipeliner = ClusterPipeliner(ClusterNodes(client, seed_url=cluster.url))
    try:
        scripts = Scripts(client, pipeliner=pipeliner)
        await scripts.load()
        clock = ManualClock(int(time.time() * 1000))
        engine = RedisEngine(
            client, scripts=scripts, idempotency_ttl_ms=60_000, clock=clock, prefix=DEFAULT_PREFIX
        )
        by_port: dict[int, int] = {}  # an item on each master
        item_id = 0
        while len(by_port) < 3:
            item_id += 1
            by_port.setdefault(owner(client, item_keys(item_id, DEFAULT_PREFIX).item), item_id)
        for item in by_port.values():
            await engine.load_item(open_item(item, total=2, hold_ms=1_000))
            held = await engine.reserve(
                item, buyer="b", quantity=1, idempotency_key="k", order_id=item
            )
            assert held.accepted
        clock.advance(1_000)  # every hold is due
        # Neither the node the client started from nor the registry's: they are not the point.
        spared = {owner(client, items_registry(DEFAULT_PREFIX)), int(cluster.url.rsplit(":", 1)[1])}
        down = next(port for port in by_port if port not in spared)
        for port in cluster.ports:
            with redis.Redis(port=port) as node:
                role = node.execute_command("ROLE")  # type: ignore[no-untyped-call]
            if port == down or (role[0] == b"slave" and int(role[2]) == down):
                cluster.node_at(port).kill()

        reaper = Reaper(engine=engine)
        assert await reaper.run_once() == 2  # the two live masters' holds, and no error
        for port, item in by_port.items():
            if port != down:
                stock = await engine.stock(item)
                assert stock is not None and (stock.available, stock.held) == (2, 0)
        with pytest.raises(REDIS_UNAVAILABLE):
            await engine.stock(by_port[down])
    finally:
        await pipeliner.aclose()
        await client.aclose()


def owner(client: RedisCluster, key: str) -> int:
    node = client.get_node_from_key(key)
    assert node is not None
    return int(node.port)
