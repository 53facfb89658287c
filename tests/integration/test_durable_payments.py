"""What the payment provider is told is never taken back: a notice is answered only once SQL holds
what it did, so every notice answered `paid` reads paid after Redis lost its last writes and was
rebuilt from SQL, and every notice answered 503 (not yet in SQL, the item recovering, Redis away)
gets its answer from a retry.

Real redis-servers of the test's own: one with an AOF that goes back, a Redis Cluster whose
lagging replica is promoted; real SQL on every backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from seckill.bootstrap.workers import WorkerKind
from seckill.domain.ids import OrderIds
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus
from seckill.engine.engine import RedisEngine
from seckill.redis_cluster import LocalCluster
from seckill.redis_server import RedisServer
from seckill.services.items import warm_item
from seckill.services.orders import ItemRecovering, NotLanded, OrderBook
from seckill.services.reconcile.reconciler import Reconciler
from seckill.store.ledger import Ledger
from seckill.workers.persister import Persister
from tests.api.conftest import Api, api_settings, running_api
from tests.conftest import new_item, redis7_binary, redis_settings
from tests.integration.test_cluster_faults import assert_consistent, drained, owner_port
from tests.integration.test_cluster_faults import cluster as cluster  # the fixture
from tests.integration.test_lagging_replica import replica_of
from tests.support.polling import wait_until
from tests.support.redis_servers import connected, copy_aof, restore_aof, rewrite_aof
from tests.support.sales import FAST, Sale, drain

ORDERS = 24
ids = OrderIds(654)


@contextlib.asynccontextmanager
async def running(*tasks: object) -> AsyncIterator[asyncio.Event]:
    """Background loops (each ``async (stop) -> None``) until the block ends."""
    stop = asyncio.Event()
    started = [asyncio.create_task(task(stop)) for task in tasks]  # type: ignore[operator]
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.gather(*started)


def persisting(persister: Persister) -> object:
    async def loop(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await persister.run_once()

    return loop


def checking_fences(engine: RedisEngine, ledger: Ledger, item_id: int) -> object:
    """The reconciler worker's fence checks: a shard whose Redis went back is rebuilt from SQL."""
    reconciler = Reconciler(engine, ledger, grace_ms=60_000)

    async def loop(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await reconciler.verify_fenced([item_id])
            await asyncio.sleep(0.02)

    return loop


async def notify(book: OrderBook, item_id: int, order_id: int) -> str | None:
    """The provider's success notice: the outcome it was told (200), or None (503: try again)."""
    try:
        settlement, _ = await book.settle_payment(
            item_id,
            order_id,
            payment_id=f"pay-{order_id}",
            succeeded=True,
            charged=Money(999, "USD"),  # new_item's price, one unit
        )
    except (NotLanded, ItemRecovering, RedisConnectionError, ConnectionError):
        return None
    return settlement.outcome.value


async def until_answered(
    book: OrderBook, item_id: int, orders: Sequence[int], told: dict[int, str]
) -> None:
    """Retry each notice not answered yet, as a provider does, until every one is."""
    async with asyncio.timeout(60):
        while missing := [o for o in orders if o not in told]:
            answers = await asyncio.gather(*(notify(book, item_id, o) for o in missing))
            for order_id, outcome in zip(missing, answers, strict=True):
                if outcome is not None:
                    told[order_id] = outcome
            await asyncio.sleep(0.05)


@pytest.mark.redis_variants("redis7")
async def test_a_paid_answer_survives_redis_going_back_to_an_older_aof(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Half the notices are answered with the persister landing them; the other half arrive
    while it is stopped (SQL cannot take them) and Redis then comes back from an AOF taken
    before any payment: no notice of the second half may have been answered."""
    data_dir = tmp_path / "r"
    server = RedisServer(binary=redis7_binary(), data_dir=data_dir, appendonly=True).start()
    told: dict[int, str] = {}  # order -> the outcome the provider got with a 200
    try:
        async with connected(server) as (redis, engine):
            item_id = await ledger.create_item(new_item(total=ORDERS, hold_seconds=3_600))
            await warm_item(engine, ledger, item_id)
            sale = Sale(engine, ledger, redis, item_id, ids)
            orders = [order for n in range(ORDERS) if (order := await sale.buy(f"b{n}"))]
            assert len(orders) == ORDERS
            await drain(sale)
            await rewrite_aof(redis)
            copy_aof(data_dir, tmp_path / "older")  # every hold, no payment

            book = OrderBook(engine=engine, ledger=ledger, landing_timeout_s=1.0)
            first, second = orders[: ORDERS // 2], orders[ORDERS // 2 :]
            async with running(persisting(sale.persister())):
                await until_answered(book, item_id, first, told)
            assert set(told.values()) == {"paid"}
            waiting = asyncio.gather(*(notify(book, item_id, o) for o in second))
            await asyncio.sleep(0.3)  # the notices applied in Redis, not landed
            server.kill()
            for order_id, outcome in zip(second, await waiting, strict=True):
                if outcome is not None:
                    told[order_id] = outcome
        restore_aof(tmp_path / "older", data_dir)  # every payment is gone from Redis
        server.start()

        async with connected(server) as (redis, engine):
            book = OrderBook(engine=engine, ledger=ledger, landing_timeout_s=1.0)
            persister = Persister(redis=redis, ledger=ledger, config=FAST, prefix=engine.prefix)
            async with running(persisting(persister), checking_fences(engine, ledger, item_id)):
                await until_answered(book, item_id, orders, told)  # the providers' retries
            await drain(Sale(engine, ledger, redis, item_id, ids))
            holds = await engine.holds(item_id)
            landed = await ledger.orders(item_id)
            for order_id, outcome in told.items():
                assert outcome == "paid", (order_id, outcome)
                assert holds[order_id].state == "paid", f"{order_id} told paid, reads held"
                assert landed[order_id].status is OrderStatus.PAID
    finally:
        server.stop()


async def pay_until_answered(api: Api, item_id: int, order_id: str, told: dict[str, str]) -> None:
    """The provider's notice, sent again after each 503 until it is answered."""
    async with asyncio.timeout(60):
        while True:
            answer = await api.pay(item_id, order_id, f"pay-{order_id}")
            if answer.status_code == 200:
                told[order_id] = answer.json()["outcome"]
                return
            assert answer.status_code == 503 and answer.headers.get("Retry-After"), answer.text
            await asyncio.sleep(0.1)


async def pay_once(api: Api, item_id: int, order_id: str, told: dict[str, str]) -> None:
    with contextlib.suppress(aiohttp.ClientError):
        answer = await api.pay(item_id, order_id, f"pay-{order_id}")
        if answer.status_code == 200:
            told[order_id] = answer.json()["outcome"]


async def test_a_paid_answer_survives_a_lagging_replica_promoted(
    cluster: LocalCluster, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    """The master of the item's slot is killed and its replica, cut off meanwhile, is promoted:
    the notices sent while the replica was cut off (and SQL could not take them) may not have
    been answered, and every `paid` told reads paid on the promoted replica."""
    settings = api_settings(
        **redis_settings(cluster), database_url=sql_url, data_dir=tmp_path,
        payment_landing_timeout_seconds=1.0, fence_check_seconds=0.05, ticket_ttl_seconds=600,
    )  # fmt: skip
    told: dict[str, str] = {}
    async with running_api(settings, workers=(WorkerKind.RECONCILER,)) as api:
        runtime = api.runtime
        item_id = await api.create_item(total=ORDERS, limit=1, hold_seconds=3_600)
        orders = []
        for n in range(ORDERS):
            bought = await api.buy(item_id, f"b{n}", f"key-{n}")
            assert bought.status_code == 202, bought.text
            orders.append(bought.json()["order_id"])
        persister = Persister(
            redis=runtime.redis,
            ledger=runtime.ledger,
            config=FAST,
            prefix=runtime.settings.key_prefix,
        )
        first, second = orders[: ORDERS // 2], orders[ORDERS // 2 :]
        async with running(persisting(persister)):
            await asyncio.gather(*(pay_until_answered(api, item_id, o, told) for o in first))
        victim = owner_port(api, item_id)
        replica = cluster.node_at(replica_of(cluster, victim)).process
        assert replica is not None
        replica.send_signal(signal.SIGSTOP)
        with redis.Redis(port=victim) as master:  # what was in flight to it is dropped
            master.execute_command("CLIENT", "KILL", "TYPE", "replica")  # type: ignore[no-untyped-call]
        waiting = asyncio.gather(*(pay_once(api, item_id, o, told) for o in second))
        await asyncio.sleep(0.3)  # applied on the master, never replicated, not landed
        cluster.node_at(victim).kill()
        replica.send_signal(signal.SIGCONT)
        await waiting

        async def three_primaries() -> bool:
            return len(await asyncio.to_thread(cluster.primary_ports)) == 3

        await wait_until(three_primaries, 30, "the lagging replica took over")
        async with running(persisting(persister)):
            await asyncio.gather(
                *(pay_until_answered(api, item_id, o, told) for o in orders if o not in told)
            )
            await wait_until(lambda: drained(api, [item_id]), 30, "every notice landed")
        holds = await runtime.engine.holds(item_id)
        landed = await ledger.orders(item_id)
        assert set(told) == set(orders)
        for order_id, outcome in told.items():
            assert outcome == "paid", (order_id, outcome)
            assert holds[int(order_id)].state == "paid", f"{order_id} told paid, reads held"
            assert landed[int(order_id)].status is OrderStatus.PAID
        await assert_consistent(api, [item_id])
