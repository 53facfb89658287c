"""The owner-token lease on a real Redis: one owner at a time; only the owner renews or drops.

One contract, run on one Redis and on a Redis Cluster (each on 6.2 and 7): a lease is one key,
so on a cluster it lives on whichever primary owns its slot, reached through the cluster client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from seckill.engine.leases import Lease
from seckill.engine.scripts import Scripts


def lease(redis: Redis, scripts: Scripts, *, ttl_ms: int = 60_000) -> Lease:
    return Lease(redis, scripts=scripts, key="t:lease", ttl_ms=ttl_ms)


async def one_owner_at_a_time(redis: Redis, scripts: Scripts) -> None:
    first, second = lease(redis, scripts), lease(redis, scripts)
    assert await first.acquire()
    assert not await second.acquire()
    assert not await first.acquire()  # held, by ourselves too: renew() keeps it
    await first.drop()
    assert not await redis.exists("t:lease")
    assert await second.acquire()


async def a_renewal_holds_the_lease_a_full_ttl_more(redis: Redis, scripts: Scripts) -> None:
    held = lease(redis, scripts)
    assert await held.acquire()
    await redis.pexpire("t:lease", 100)  # as if most of the lease had gone by
    assert await held.renew()
    assert await redis.pttl("t:lease") > 59_000


async def a_late_renewal_changes_nothing(redis: Redis, scripts: Scripts) -> None:
    late, other = lease(redis, scripts, ttl_ms=100), lease(redis, scripts)
    assert await late.acquire()
    await asyncio.sleep(0.2)  # lapsed: anyone may take it now
    assert await other.acquire()
    assert not await late.renew()
    await late.drop()  # must not end the new owner's lease
    assert await redis.pttl("t:lease") > 1_000
    assert await other.renew()


async def a_lease_never_acquired_is_not_ours(redis: Redis, scripts: Scripts) -> None:
    await redis.set("t:lease", "someone", px=60_000)
    never = lease(redis, scripts)
    assert not await never.renew()
    await never.drop()
    assert await redis.get("t:lease") == "someone"


async def holding_renews_once_a_third_of_the_ttl(redis: Redis, scripts: Scripts) -> None:
    """A holder asked again and again renews only once a third of its lease has gone by, and
    one that lost it (it lapsed, someone else took it) is told so."""
    held, other = lease(redis, scripts, ttl_ms=600), lease(redis, scripts)
    assert await held.hold()  # taken
    await redis.pexpire("t:lease", 500)
    assert await held.hold()  # still well within its lease: nothing sent
    assert await redis.pttl("t:lease") <= 500
    await asyncio.sleep(0.25)  # past a third of 600 ms
    assert await held.hold()
    assert await redis.pttl("t:lease") > 500  # renewed
    await asyncio.sleep(0.7)  # lapsed
    assert await other.acquire()
    assert not await held.hold()


Check = Callable[[Redis, Scripts], Awaitable[None]]
CONTRACT: list[Check] = [
    one_owner_at_a_time,
    a_renewal_holds_the_lease_a_full_ttl_more,
    a_late_renewal_changes_nothing,
    a_lease_never_acquired_is_not_ours,
    holding_renews_once_a_third_of_the_ttl,
]
_IDS = [check.__name__ for check in CONTRACT]


@pytest.mark.parametrize("check", CONTRACT, ids=_IDS)
async def test_on_one_redis(check: Check, redis: Redis, scripts: Scripts) -> None:
    await check(redis, scripts)


@pytest.mark.parametrize("check", CONTRACT, ids=_IDS)
async def test_on_a_cluster(check: Check, cluster_redis: RedisCluster) -> None:
    scripts = Scripts(cluster_redis)  # type: ignore[arg-type]  # routed by each call's key
    await scripts.load()
    await check(cluster_redis, scripts)  # type: ignore[arg-type]
