"""The database unreachable for a while: selling goes on in Redis, and nothing is lost.

The persister reaches the database through a TCP proxy the test cuts and restores. While it is
cut, every purchase is still answered (the hot path never waits for SQL) up to the stock, and the
persister keeps its batch and retries without counting deliveries, so nothing becomes a dead
letter. Once the proxy lets connections through again, the backlog lands and SQL agrees with
Redis order for order.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.engine import make_url

from benchmarks.tcp_proxy import TcpProxy
from seckill.domain.events import ReleaseReason
from seckill.domain.holds import HoldState, Reservation
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.streams import GROUP, stream_drained
from seckill.services.items import warm_item
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.workers.loop import run_until_stopped
from seckill.workers.persister import Persister, PersisterConfig
from tests.conftest import SERVER_BACKENDS, new_item, pay
from tests.support.polling import wait_until
from tests.support.sales import Sale, assert_sql_matches_redis

T = TypeVar("T")

CONFIG = PersisterConfig(
    batch_size=100, block_ms=50, claim_idle_ms=500, trim_every_s=0.2, retry_pause_s=0.05
)
ANSWER_S = 10.0  # a bound, not a speed target: an answer waiting on SQL would hang
OUTAGE_S = 1.5  # > claim_idle_ms, and several retry pauses (0.05, 0.1, 0.2, 0.4, 0.8)
DRAIN_S = 60.0


async def answered(call: Awaitable[T]) -> T:
    async with asyncio.timeout(ANSWER_S):
        return await call


def retries(caplog: pytest.LogCaptureFixture) -> int:
    """Tries of a batch that found the database unavailable, so far."""
    return sum("database unavailable" in r.getMessage() for r in caplog.records)


async def reserve(sale: Sale, buyer: str, quantity: int) -> Reservation:
    return await answered(
        sale.engine.reserve(
            sale.item_id,
            buyer=buyer,
            quantity=quantity,
            idempotency_key="k",
            order_id=sale.ids.next(),
        )
    )


@pytest.fixture
async def proxied_ledger(sql_url: str) -> AsyncIterator[tuple[Ledger, TcpProxy]]:
    """A ledger on the same database as ``sql_url``, reached through a proxy the test can cut."""
    url = make_url(sql_url)
    assert url.host and url.get_backend_name() != "sqlite"
    default_port = 5432 if url.get_backend_name() == "postgresql" else 3306
    proxy = TcpProxy(url.host, url.port or default_port)
    await proxy.start()
    engine = open_database(
        url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    )
    try:
        yield Ledger(engine), proxy
    finally:
        proxy.restore()
        await engine.dispose()
        await proxy.stop()
    assert proxy.active == 0


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS, indirect=True)
async def test_sales_go_on_while_the_database_is_cut_and_the_backlog_lands_after(
    engine: RedisEngine,
    ledger: Ledger,
    redis: Redis,
    proxied_ledger: tuple[Ledger, TcpProxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="seckill")
    info = await redis.info("server")
    assert str(info["redis_version"]).startswith("7."), info["redis_version"]
    persister_ledger, proxy = proxied_ledger
    rng = random.Random(3)
    item_id = await ledger.create_item(new_item(total=60, limit=2))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(7))  # checks read SQL directly
    stream = engine.keys(item_id).events

    persister = Persister(
        redis=redis, ledger=persister_ledger, config=CONFIG, prefix=DEFAULT_PREFIX
    )
    stop = asyncio.Event()
    worker = asyncio.create_task(run_until_stopped(persister, stop))
    try:
        # Before: reservations land through the proxy.
        before = [await answered(sale.buy(f"early{n}")) for n in range(10)]
        assert all(before)
        await answered(pay(engine, item_id, before[0]))
        await answered(engine.release(item_id, before[1], ReleaseReason.CANCELLED))
        await wait_until(lambda: stream_drained(redis, stream), DRAIN_S, "first sales landed")
        assert len(await ledger.orders(item_id)) == 10
        assert proxy.accepted >= 1

        # The database is cut: selling goes on in Redis, up to the stock.
        proxy.cut()
        accepted_at_cut = proxy.accepted
        answers: list[Outcome] = []
        n = 0
        while (stock := await answered(engine.stock(item_id))) and stock.available:
            assert n < 500, "never sold out"
            burst = [(f"late{n + k}", rng.choice((1, 2))) for k in range(8)]
            n += len(burst)
            replies = await asyncio.gather(*(reserve(sale, b, q) for b, q in burst))
            for reply in replies:
                answers.append(reply.outcome)
                if not reply.accepted:
                    continue
                assert reply.order_id is not None
                fate = rng.random()
                if fate < 0.4:
                    paid = await answered(pay(engine, item_id, reply.order_id))
                    assert paid.outcome is Outcome.PAID
                elif fate < 0.6:
                    await answered(engine.release(item_id, reply.order_id, ReleaseReason.EXPIRED))
        assert set(answers) <= {Outcome.RESERVED, Outcome.SOLD_OUT, Outcome.INSUFFICIENT_STOCK}
        assert answers.count(Outcome.RESERVED) > 20
        last = [(await reserve(sale, f"last{k}", 1)).outcome for k in range(3)]
        assert last == [Outcome.SOLD_OUT] * 3

        # Still cut, for several retry pauses and past claim_idle_ms: nothing moves in SQL,
        # nothing becomes a dead letter, the persister is alive and keeps trying.
        refused_before = proxy.refused
        await asyncio.sleep(OUTAGE_S)

        async def tried_again() -> bool:
            return proxy.refused > refused_before

        # the pause between tries doubles up to 5 s: one more try is due within that
        await wait_until(tried_again, 6.0, "the persister tried the database again")
        assert not worker.done()
        assert persister.dead_lettered == 0
        assert await ledger.dead_letters() == []
        assert len(await ledger.orders(item_id)) == 10
        assert not await stream_drained(redis, stream)
        pending = await redis.xpending_range(stream, GROUP, min="-", max="+", count=1_000)
        assert pending and all(p["times_delivered"] == 1 for p in pending)
        assert proxy.accepted == accepted_at_cut  # no connection got through while cut

        # The database is back: the backlog lands, once.
        proxy.restore()
        await wait_until(lambda: stream_drained(redis, stream), DRAIN_S, "backlog landed")
        assert proxy.accepted > accepted_at_cut
        await assert_sql_matches_redis(sale)
        assert await ledger.dead_letters() == []
        assert persister.dead_lettered == 0
        holds = (await engine.holds(item_id)).values()
        assert {h.state for h in holds} == {HoldState.HELD, HoldState.PAID, HoldState.RELEASED}
        settled = sum(h.state is not HoldState.HELD for h in holds)
        assert await ledger.journal_size(item_id) == 1 + len(holds) + settled
        assert persister.landed == 1 + len(holds) + settled
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await worker  # the loop ends once the pass in hand is done
    assert retries(caplog), "the outage never reached the persister's retry loop"
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert failed == [], [r.getMessage() for r in failed]


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS, indirect=True)
async def test_entries_redis_lost_during_the_outage_are_not_landed_after_it(
    engine: RedisEngine,
    ledger: Ledger,
    redis: Redis,
    proxied_ledger: tuple[Ledger, TcpProxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="seckill")
    persister_ledger, proxy = proxied_ledger
    item_id = await ledger.create_item(new_item(total=20, limit=1))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(7))
    stream = engine.keys(item_id).events
    proxy.cut()
    orders = [await answered(sale.buy(f"buyer{n}")) for n in range(6)]
    assert all(orders)
    persister = Persister(
        redis=redis, ledger=persister_ledger, config=CONFIG, prefix=DEFAULT_PREFIX
    )
    stop = asyncio.Event()
    worker = asyncio.create_task(run_until_stopped(persister, stop))
    try:

        async def in_hand() -> bool:  # read in one batch, which waits for the database
            try:
                pending = await redis.xpending_range(stream, GROUP, "-", "+", 100)
            except ResponseError:  # the group is not made yet
                return False
            return len(pending) == 7  # the load and the six sales

        await wait_until(in_hand, DRAIN_S, "the persister read the sales")
        # Redis loses the last three (as a restart from an older AOF would): their entries
        # go, and the reconciler would find SQL agreeing with Redis without them.
        entries = await redis.xrange(stream, "-", "+")
        lost = [entry_id for entry_id, fields in entries if fields.get("event") == "reserved"][3:]
        assert len(lost) == 3
        tries = retries(caplog)
        await redis.xdel(stream, *lost)

        async def tried_since() -> bool:  # a try that failed after the loss: the next one checks
            return retries(caplog) > tries

        await wait_until(tried_since, DRAIN_S, "the persister tried again")
        proxy.restore()

        async def landed_three() -> bool:
            return len(await ledger.orders(item_id)) == 3

        await wait_until(landed_three, DRAIN_S, "the three Redis kept landed")
        await wait_until(lambda: stream_drained(redis, stream), DRAIN_S, "nothing pending")
        assert set(await ledger.orders(item_id)) == set(orders[:3])
        assert persister.dead_lettered == 0
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await worker
    gone = [r for r in caplog.records if "gone from Redis" in r.getMessage()]
    assert gone and "3 entries" in gone[0].getMessage()
