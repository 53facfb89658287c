"""Durability "replicas": a write is answered only once a replica acknowledged it (WAIT).

Each test starts its own primary (and replicas) on free loopback ports, with the same binary as
the session's server, so it runs on Redis 6.2 and 7 like the rest of the suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis.asyncio import Redis

from seckill.domain.holds import HoldState, Reservation
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.queues import Queues
from seckill.engine.scripts import Durability, NotDurable, Scripts
from seckill.redis_server import RedisServer
from seckill.store.ledger import Ledger
from tests.api.conftest import api_settings, running_api
from tests.conftest import open_item
from tests.support.polling import wait_until
from tests.support.redis_servers import free_port

# WAIT returns at the first acknowledgement, so calls that must succeed get a long timeout (a
# busy machine never fails them), and calls that must time out (no replica) a short one.
PATIENT = Durability(replicas=1, timeout_ms=10_000)
QUICK = Durability(replicas=1, timeout_ms=50)
IDEMPOTENCY_TTL_MS = 3_600_000

ids = OrderIds(7)


async def start_server(binary: Path) -> tuple[RedisServer, Redis]:
    server = RedisServer(binary=binary, port=free_port())
    await asyncio.to_thread(server.start)
    return server, Redis.from_url(server.url, decode_responses=True)


@dataclass
class Servers:
    """A primary, and the replicas a test attaches to it."""

    binary: Path
    primary: RedisServer
    redis: Redis
    replicas: list[tuple[RedisServer, Redis]] = field(default_factory=list)

    async def attach_replica(self) -> Redis:
        """A new replica of the primary, acknowledging writes when this returns; a client on it."""
        server, client = await start_server(self.binary)
        self.replicas.append((server, client))
        await client.replicaof("127.0.0.1", self.primary.port)
        # "online" is not enough: after a diskless sync the primary may hold the stream back
        # until the replica's first ACK (up to a second later). A write made once it is online
        # (so past the sync's offset) and seen by WAIT is.
        await wait_until(self._online, 10, "the replica comes online")
        await wait_until(self._replicated, 10, "the replica acknowledges a write")
        return client

    async def _online(self) -> bool:
        info = await self.redis.info("replication")
        return any(isinstance(v, dict) and v.get("state") == "online" for v in info.values())

    async def _replicated(self) -> bool:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set("replication-probe", "1")
            pipe.wait(1, 100)
            _, acked = await pipe.execute()
        return bool(acked)

    async def stop_replicas(self) -> None:
        for server, client in self.replicas:
            await client.aclose()
            await asyncio.to_thread(server.stop)
        self.replicas.clear()


@pytest.fixture
async def servers(redis_server: RedisServer) -> AsyncIterator[Servers]:
    primary, client = await start_server(redis_server.binary)
    # Redis 7 delays a diskless full sync by 5 s by default, to batch replicas that come together.
    await client.config_set("repl-diskless-sync-delay", 0)
    found = Servers(redis_server.binary, primary, client)
    try:
        yield found
    finally:
        await found.stop_replicas()
        await client.aclose()
        await asyncio.to_thread(primary.stop)


async def engine_on(redis: Redis, durability: Durability | None) -> RedisEngine:
    """A RedisEngine wired as bootstrap wires it."""
    scripts = Scripts(redis, durability=durability)
    await scripts.load()
    return RedisEngine(
        redis, scripts=scripts, idempotency_ttl_ms=IDEMPOTENCY_TTL_MS, prefix=DEFAULT_PREFIX
    )


async def buy(
    engine: RedisEngine, buyer: str, *, key: str = "", item_id: int = 1, order_id: int = 0
) -> Reservation:
    return await engine.reserve(
        item_id,
        buyer=buyer,
        quantity=1,
        idempotency_key=key or f"{buyer}-{ids.next()}",
        order_id=order_id or ids.next(),
    )


async def test_a_reservation_is_answered_once_a_replica_holds_it(servers: Servers) -> None:
    replica = await servers.attach_replica()
    engine = await engine_on(servers.redis, PATIENT)
    assert await engine.load_item(open_item(total=5)) is Outcome.LOADED
    await servers.redis.script_flush()  # the pipelined call reloads on NOSCRIPT like the plain one

    reservation = await buy(engine, "alice")

    assert reservation.outcome is Outcome.RESERVED and not reservation.replayed
    assert reservation.order_id is not None
    hold = await (await engine_on(replica, None)).hold(1, reservation.order_id)
    assert hold is not None and (hold.buyer, hold.state) == ("alice", HoldState.HELD)


async def test_without_a_replica_a_write_is_not_durable_and_its_retry_replays(
    servers: Servers,
) -> None:
    await (await engine_on(servers.redis, None)).load_item(open_item(total=5))
    order_id = ids.next()

    with pytest.raises(NotDurable, match="acknowledged by 0 of 1 replicas within 50 ms"):
        await buy(await engine_on(servers.redis, QUICK), "alice", key="k1", order_id=order_id)

    engine = await engine_on(servers.redis, PATIENT)
    hold = await engine.hold(1, order_id)  # the write happened, on the primary only
    assert hold is not None and hold.state is HoldState.HELD
    replica = await servers.attach_replica()
    retry = await buy(engine, "alice", key="k1")
    assert (retry.outcome, retry.replayed, retry.order_id) == (Outcome.RESERVED, True, order_id)
    assert await (await engine_on(replica, None)).hold(1, order_id) is not None


async def test_a_queue_position_is_answered_once_a_replica_holds_it(servers: Servers) -> None:
    await (await engine_on(servers.redis, None)).load_item(open_item(total=5, waiting_room=True))
    with pytest.raises(NotDurable):
        await Queues(await engine_on(servers.redis, QUICK)).join(1, "alice", lead_ms=0)
    replica = await servers.attach_replica()
    retry = await Queues(await engine_on(servers.redis, PATIENT)).join(1, "alice", lead_ms=0)
    assert (retry.outcome, retry.position) == (Outcome.ALREADY_QUEUED, 1)
    place = await Queues(await engine_on(replica, None)).place(1, "alice")
    assert place.position == 1


async def test_refusals_and_invalid_requests_need_no_replica(servers: Servers) -> None:
    engine = await engine_on(servers.redis, QUICK)
    with pytest.raises(NotDurable):
        await engine.load_item(open_item(total=1))  # loaded on the primary all the same
    taken = ids.next()
    with pytest.raises(NotDurable):
        await buy(engine, "alice", order_id=taken)

    assert (await buy(engine, "bob")).outcome is Outcome.SOLD_OUT
    assert (await buy(engine, "bob", item_id=99)).outcome is Outcome.UNKNOWN_ITEM
    with pytest.raises(InvalidRequest) as refused:
        await buy(engine, "carol", order_id=taken)
    assert refused.value.code is ErrorCode.DUPLICATE_ORDER_ID
    assert await engine.expire_due(1) == []  # nothing due: nothing written
    stock = await engine.stock(1)
    assert stock is not None and (stock.available, stock.held) == (0, 1)


async def test_the_api_answers_503_not_durable_and_the_retry_gets_the_same_order(
    servers: Servers, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    await servers.attach_replica()
    settings = api_settings(
        redis_url=servers.primary.url,
        database_url=sql_url,
        data_dir=tmp_path,
        redis_durability="replicas",
        # One timeout for the calls that must succeed and the one that must time out.
        redis_wait_timeout_ms=500,
    )
    async with running_api(settings) as api:
        item_id = await api.create_item(total=5)  # warmed while the replica is up
        await servers.stop_replicas()

        refused = await api.buy(item_id, "alice", "key-1")
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"] == "not_durable"

        await servers.attach_replica()
        retried = await api.buy(item_id, "alice", "key-1")
        assert retried.status_code == 202, retried.text
        assert list(await api.runtime.engine.holds(item_id)) == [int(retried.json()["order_id"])]
