"""The Pipeliner against real Redis (6.2 and 7): concurrent calls leave in batches, and every
caller gets its own reply, its own error, or (connection lost) a redis ConnectionError."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, DataError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.pipelining import Pipeliner, PipelinerClosed
from seckill.engine.scripts import ScriptName, Scripts
from seckill.redis_server import RedisServer
from tests.conftest import open_item
from tests.support.redis_servers import free_port


@pytest.fixture
async def pipeliner(redis: Redis, redis_server: RedisServer) -> AsyncIterator[Pipeliner]:
    pipeliner = Pipeliner(redis_server.url, connections=2)
    yield pipeliner
    await pipeliner.aclose()


@pytest.fixture
async def pipelined(redis: Redis, pipeliner: Pipeliner) -> RedisEngine:
    """An engine wired as bootstrap wires it."""
    scripts = Scripts(redis, pipeliner=pipeliner)
    await scripts.load()
    return RedisEngine(redis, scripts=scripts, idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX)


def batches(pipeliner: Pipeliner) -> int:
    return sum(pipeliner.batch_sizes.values())


def commands(pipeliner: Pipeliner) -> int:
    return sum(size * n for size, n in pipeliner.batch_sizes.items())


async def test_concurrent_calls_each_get_their_own_reply_in_few_batches(
    pipeliner: Pipeliner,
) -> None:
    replies = await asyncio.gather(*(pipeliner.execute("ECHO", f"call-{n}") for n in range(2_000)))
    assert replies == [f"call-{n}" for n in range(2_000)]
    assert commands(pipeliner) == 2_000
    assert batches(pipeliner) <= 10  # one tick's calls: a batch per connection at most, capped


async def test_a_batch_is_capped(redis_server: RedisServer) -> None:
    pipeliner = Pipeliner(redis_server.url, connections=1, max_batch=64)
    try:
        replies = await asyncio.gather(*(pipeliner.execute("ECHO", str(n)) for n in range(1_000)))
    finally:
        await pipeliner.aclose()
    assert replies == [str(n) for n in range(1_000)]
    assert max(pipeliner.batch_sizes) == 64
    assert commands(pipeliner) == 1_000


async def test_concurrent_reservations_through_the_engine(
    pipelined: RedisEngine, pipeliner: Pipeliner
) -> None:
    await pipelined.load_item(open_item(total=1_500))
    before = batches(pipeliner)

    async def buy(n: int) -> tuple[Outcome, int | None]:
        reservation = await pipelined.reserve(
            1, buyer=f"b{n}", quantity=1, idempotency_key=f"k{n}", order_id=10_000 + n
        )
        return reservation.outcome, reservation.order_id

    answers = await asyncio.gather(*(buy(n) for n in range(2_000)))
    reserved = {n: order_id for n, (outcome, order_id) in enumerate(answers) if order_id}
    assert len(reserved) == 1_500
    assert all(order_id == 10_000 + n for n, order_id in reserved.items())  # its own answer
    assert {outcome for outcome, _ in answers} == {Outcome.RESERVED, Outcome.SOLD_OUT}
    stock = await pipelined.stock(1)
    assert stock is not None and (stock.available, stock.held) == (0, 1_500)
    assert batches(pipeliner) - before < 100  # far fewer round trips than calls

    # The sold-out path's read goes through the same pipeliner and finds each buyer's answer.
    before = commands(pipeliner)
    recorded = await asyncio.gather(
        *(
            pipelined.recorded(1, buyer=f"b{n}", quantity=1, idempotency_key=f"k{n}")
            for n in range(2_000)
        )
    )
    assert {n: r.order_id for n, r in enumerate(recorded) if r is not None} == reserved
    assert commands(pipeliner) - before == 2_000


async def test_an_error_reply_fails_only_its_own_call(redis: Redis, pipeliner: Pipeliner) -> None:
    await redis.set("a-string", "x")
    answers = await asyncio.gather(
        pipeliner.execute("INCR", "counter"),
        pipeliner.execute("LPUSH", "a-string", "y"),  # WRONGTYPE
        pipeliner.execute("SET", "bad", None),  # redis-py cannot encode None: never sent
        pipeliner.execute("EVALSHA", "0" * 40, 0),  # NOSCRIPT
        pipeliner.execute("INCR", "counter"),
        return_exceptions=True,
    )
    assert answers[0] == 1 and answers[4] == 2
    assert isinstance(answers[1], ResponseError) and "WRONGTYPE" in str(answers[1])
    assert isinstance(answers[2], DataError)
    assert isinstance(answers[3], NoScriptError)
    assert await pipeliner.execute("GET", "counter") == "2"  # replies still line up
    assert not await redis.exists("bad")


async def test_noscript_reloads_and_retries_through_the_pipeliner(
    redis: Redis, pipelined: RedisEngine, pipeliner: Pipeliner
) -> None:
    await pipelined.load_item(open_item(total=10, limit=1))
    await redis.script_flush()  # as after a restart or a failover
    before = commands(pipeliner)
    answers = await asyncio.gather(
        *(
            pipelined.reserve(1, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=n + 1)
            for n in range(5)
        )
    )
    assert {a.outcome for a in answers} == {Outcome.RESERVED}
    assert commands(pipeliner) - before == 10  # each sent twice: NOSCRIPT, then the retry
    assert await redis.script_exists(Scripts(redis)[ScriptName.RESERVE].sha) == [True]
    stock = await pipelined.stock(1)
    assert stock is not None and stock.held == 5


async def test_a_cancelled_caller_does_not_disturb_the_others(
    redis_server: RedisServer,
) -> None:
    pipeliner = Pipeliner(redis_server.url, connections=1)
    try:
        # BLPOP holds the batch's replies back for 0.3 s: the cancellations land mid-flight.
        slow = pipeliner.execute("BLPOP", "nothing-here", 0.3)
        calls = [asyncio.ensure_future(pipeliner.execute("ECHO", str(n))) for n in range(100)]
        await asyncio.sleep(0.1)
        for call in calls[::3]:
            call.cancel()
        assert await slow is None
        for n, call in enumerate(calls):
            if n % 3 == 0:
                assert call.cancelled()
            else:
                assert await call == str(n)
        assert await pipeliner.execute("ECHO", "after") == "after"
        assert pipeliner.batch_sizes[101] == 1  # the cancelled calls were sent and read
    finally:
        await pipeliner.aclose()


async def test_a_call_cancelled_before_its_batch_leaves_is_not_sent(
    redis: Redis, pipeliner: Pipeliner
) -> None:
    kept = pipeliner.execute("SET", "kept", "1")
    dropped = pipeliner.execute("SET", "dropped", "1")
    dropped.cancel()
    assert await kept == "OK"
    assert await redis.get("kept") == "1"
    assert not await redis.exists("dropped")


async def test_a_killed_server_fails_the_calls_in_flight_then_calls_work_again(
    redis_server: RedisServer,
) -> None:
    server = RedisServer(binary=redis_server.binary, port=free_port())
    await asyncio.to_thread(server.start)
    pipeliner = Pipeliner(server.url, connections=2)
    answered = 0
    under_load = asyncio.Event()
    try:

        async def caller(n: int) -> BaseException:
            nonlocal answered
            while True:
                try:
                    await pipeliner.execute("INCR", f"n{n % 10}")
                except BaseException as exc:
                    return exc
                answered += 1
                if answered == 5_000:
                    under_load.set()

        callers = [asyncio.ensure_future(caller(n)) for n in range(2_000)]
        async with asyncio.timeout(30):
            await under_load.wait()
        await asyncio.to_thread(server.kill)
        async with asyncio.timeout(10):  # a hang fails here
            errors = await asyncio.gather(*callers)
        assert all(
            isinstance(e, RedisConnectionError) and not isinstance(e, PipelinerClosed)
            for e in errors
        ), {type(e) for e in errors}

        await asyncio.to_thread(server.start)  # the same port
        again = await asyncio.gather(*(pipeliner.execute("ECHO", str(n)) for n in range(100)))
        assert again == [str(n) for n in range(100)]
    finally:
        await pipeliner.aclose()
        await asyncio.to_thread(server.stop)


async def test_the_url_password_and_db_open_each_connection(redis_server: RedisServer) -> None:
    """A new connection sends AUTH and SELECT from the URL before anything else; a wrong
    password fails the calls with redis-py's AuthenticationError."""
    server = RedisServer(binary=redis_server.binary, port=free_port())
    await asyncio.to_thread(server.start)  # its readiness check needs no password: set it now
    async with Redis.from_url(server.url) as redis:
        await redis.config_set("requirepass", "s3cret")
    address = f"127.0.0.1:{server.port}"
    right = Pipeliner(f"redis://:s3cret@{address}/3", connections=2)
    wrong = Pipeliner(f"redis://:wrong@{address}/0", connections=1)
    try:
        await asyncio.gather(*(right.execute("SET", f"k{n}", n) for n in range(100)))
        assert " db=3 " in await right.execute("CLIENT", "INFO")
        async with Redis.from_url(f"redis://:s3cret@{address}/3") as redis:
            assert await redis.dbsize() == 100
        with pytest.raises(AuthenticationError):
            await wrong.execute("PING")
        assert await right.execute("GET", "k7") == "7"  # the other pipeliner is unaffected
    finally:
        await right.aclose()
        await wrong.aclose()
        await asyncio.to_thread(server.stop)


async def test_after_aclose_calls_raise_and_open_calls_fail(redis_server: RedisServer) -> None:
    pipeliner = Pipeliner(redis_server.url, connections=1)
    in_flight = pipeliner.execute("BLPOP", "nothing-here", 5)
    await asyncio.sleep(0.05)  # sent: the only connection is busy
    queued = pipeliner.execute("ECHO", "waiting")
    async with asyncio.timeout(2):
        await pipeliner.aclose()
    for call in (in_flight, queued):
        with pytest.raises(PipelinerClosed):
            await call
    with pytest.raises(PipelinerClosed, match="closed"):
        pipeliner.execute("PING")
    assert issubclass(PipelinerClosed, RedisConnectionError)  # the API answers 503
