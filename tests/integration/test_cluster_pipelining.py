"""The purchase path's batches on a real Redis Cluster: each command joins the batch of the
node that owns its key, a script missing on one node is loaded on every primary, and a durable
write waits for its own node's replica."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import MovedError

from seckill.domain.outcomes import Outcome
from seckill.engine.cluster import ClusterNodes, ClusterPipeliner
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.engine.scripts import Durability, ScriptName, Scripts
from seckill.redis_cluster import LocalCluster
from tests.conftest import open_item

ITEMS = range(1, 13)  # twelve items: their slots fall on every master of three


@pytest.fixture
async def pipeliner(
    cluster_redis: RedisCluster, redis_cluster: LocalCluster
) -> AsyncIterator[ClusterPipeliner]:
    pipeliner = ClusterPipeliner(ClusterNodes(cluster_redis, seed_url=redis_cluster.url))
    yield pipeliner
    await pipeliner.aclose()


async def engine_on(
    cluster: RedisCluster, pipeliner: ClusterPipeliner, durability: Durability | None = None
) -> RedisEngine:
    """An engine wired as bootstrap wires it on a cluster."""
    scripts = Scripts(cluster, pipeliner=pipeliner, durability=durability)
    await scripts.load()
    return RedisEngine(
        cluster, scripts=scripts, idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX
    )


def nodes_of(cluster: RedisCluster) -> set[str]:
    return {cluster.get_node_from_key(item_keys(i, DEFAULT_PREFIX).item).name for i in ITEMS}


async def test_each_call_joins_the_batch_of_its_own_node(
    cluster_redis: RedisCluster, pipeliner: ClusterPipeliner
) -> None:
    engine = await engine_on(cluster_redis, pipeliner)
    assert len(nodes_of(cluster_redis)) == 3
    for item_id in ITEMS:
        await engine.load_item(open_item(item_id, total=50))

    async def buy(item_id: int, n: int) -> Outcome:
        reservation = await engine.reserve(
            item_id, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=item_id * 1000 + n
        )
        assert reservation.order_id in (None, item_id * 1000 + n)  # its own answer
        return reservation.outcome

    answers = await asyncio.gather(*(buy(i, n) for i in ITEMS for n in range(60)))
    assert answers.count(Outcome.RESERVED) == 50 * len(ITEMS)
    assert answers.count(Outcome.SOLD_OUT) == 10 * len(ITEMS)
    for item_id in ITEMS:
        stock = await engine.stock(item_id)
        assert stock is not None and (stock.available, stock.held) == (0, 50)
    sizes = pipeliner.nodes.batch_sizes()
    assert set(sizes) == nodes_of(cluster_redis)  # one pipeliner per primary, no other
    sent = sum(size * n for by_size in sizes.values() for size, n in by_size.items())
    batches = sum(n for by_size in sizes.values() for n in by_size.values())
    assert sent >= len(answers) and batches < len(answers) / 10  # far fewer writes than calls


async def test_a_script_lost_by_one_primary_is_loaded_again_on_every_primary(
    cluster_redis: RedisCluster, pipeliner: ClusterPipeliner
) -> None:
    engine = await engine_on(cluster_redis, pipeliner)
    for item_id in ITEMS:
        await engine.load_item(open_item(item_id, total=5))
    lost_on = cluster_redis.get_node_from_key(item_keys(1, DEFAULT_PREFIX).item)
    await cluster_redis.execute_command("SCRIPT FLUSH", target_nodes=lost_on)  # as on a promotion
    sha = Scripts(cluster_redis)[ScriptName.RESERVE].sha
    assert await cluster_redis.execute_command("SCRIPT EXISTS", sha, target_nodes=lost_on) == [
        False
    ]

    answers = await asyncio.gather(
        *(engine.reserve(i, buyer="b", quantity=1, idempotency_key="k", order_id=i) for i in ITEMS)
    )
    assert {a.outcome for a in answers} == {Outcome.RESERVED}
    for primary in cluster_redis.get_primaries():
        assert await cluster_redis.execute_command("SCRIPT EXISTS", sha, target_nodes=primary) == [
            True
        ]


async def test_a_durable_write_waits_for_the_replica_of_its_own_node(
    cluster_redis: RedisCluster, pipeliner: ClusterPipeliner, redis_cluster: LocalCluster
) -> None:
    engine = await engine_on(cluster_redis, pipeliner, Durability(replicas=1, timeout_ms=2_000))
    for item_id in ITEMS:
        assert await engine.load_item(open_item(item_id, total=3)) is Outcome.LOADED
    answers = await asyncio.gather(
        *(
            engine.reserve(i, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=i * 10 + n)
            for i in ITEMS
            for n in range(4)
        )
    )
    assert sum(a.outcome is Outcome.RESERVED for a in answers) == 3 * len(ITEMS)
    # Each write is on its node's replica once answered: read every replica directly.
    held_on_replicas: dict[int, str] = {}
    replicas = set(redis_cluster.ports) - set(redis_cluster.primary_ports())
    for port in replicas:
        async with Redis(port=port, decode_responses=True) as replica:
            await replica.execute_command("READONLY")
            for item_id in ITEMS:
                try:
                    held = await replica.hget(item_keys(item_id, DEFAULT_PREFIX).item, "held")
                except MovedError:  # another primary's slot
                    continue
                held_on_replicas[item_id] = str(held)
    assert held_on_replicas == dict.fromkeys(ITEMS, "3")
