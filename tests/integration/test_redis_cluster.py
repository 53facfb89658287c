"""The local Redis Cluster that `seckill dev-cluster` and the cluster tests start: formed with
every slot served, reachable through a cluster client, and healing after a master dies."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from seckill.redis_cluster import SLOTS, LocalCluster, slot_ranges

KEYS = [f"seckill:{{item:{n}}}" for n in range(200)]


def test_slot_ranges_cover_every_slot_once() -> None:
    for masters in (1, 2, 3, 5, 7):
        ranges = slot_ranges(masters)
        assert len(ranges) == masters
        assert [s for r in ranges for s in r] == list(range(SLOTS))
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


async def test_the_cluster_serves_every_slot(redis_cluster: LocalCluster) -> None:
    client = RedisCluster.from_url(redis_cluster.url, decode_responses=True)
    try:
        info = await client.cluster_info()
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_slots_ok"]) == SLOTS
        assert int(info["cluster_known_nodes"]) == 6
        assert len(redis_cluster.primary_ports()) == 3
        # Keys of different items land on every master, and read back through the client.
        for n, key in enumerate(KEYS):
            await client.set(key, n)
        assert [int(v) for v in await client.mget_nonatomic(KEYS)] == list(range(len(KEYS)))
        owners = {client.get_node_from_key(key).port for key in KEYS}
        assert owners == set(redis_cluster.primary_ports())
    finally:
        await client.aclose()


async def test_a_killed_master_is_replaced_by_its_replica(redis_cluster: LocalCluster) -> None:
    client = RedisCluster.from_url(redis_cluster.url, decode_responses=True)
    try:
        for n, key in enumerate(KEYS):
            await client.set(key, n)
        for node in client.get_primaries():  # every write on its replica before the kill
            await client.execute_command("WAIT", 1, 5000, target_nodes=node)
    finally:
        await client.aclose()
    before = redis_cluster.primary_ports()
    victim = before[0]
    redis_cluster.node_at(victim).kill()
    deadline = time.monotonic() + 30
    while len(redis_cluster.primary_ports()) < 3:
        assert time.monotonic() < deadline, "no replica took over within 30 s"
        await asyncio.sleep(0.1)
    after = redis_cluster.primary_ports()
    assert victim not in after and set(before) - {victim} <= set(after)
    # The replica had the data: every key written before the failover is still there, read
    # through a client that met the cluster mid-failover and learns the new layout as it goes.
    client = RedisCluster.from_url(redis_cluster.url, decode_responses=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                values = await client.mget_nonatomic(KEYS)
                break
            # A node that has not yet heard of the promotion still maps the victim's slots to
            # nobody: the client's first slot map then misses them (RedisClusterException).
            except (RedisError, RedisClusterException):
                assert time.monotonic() < deadline, "the cluster did not heal within 30 s"
                await asyncio.sleep(0.1)
        assert [int(v) for v in values] == list(range(len(KEYS)))
        assert (await client.cluster_info())["cluster_state"] == "ok"
    finally:
        await client.aclose()
