"""The per-buyer rate limit inside the reserve script, against a real Redis (6.2 and 7).

Counted per (item, buyer) in the item's slot; every attempt that passed validation and is not a
replay counts, and the attempt past the limit is refused (``rate_limited``) and writes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from seckill.domain.holds import Reservation
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.rules import MAX_HOLD_MS
from seckill.engine.base import RateLimit
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import ScriptName, Scripts
from seckill.redis_server import RedisServer
from tests.conftest import ManualClock, open_item

ids = OrderIds(5)
LIMIT = RateLimit(requests=3, window_ms=60_000)  # long in real time: the test clock moves it


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A client that reads bytes, for DUMP."""
    async with Redis.from_url(redis_server.url) as client:
        yield client


@pytest.fixture
def limited(redis: Redis, scripts: Scripts, clock: ManualClock) -> RedisEngine:
    """An engine with LIMIT, on the test's clock."""
    return RedisEngine(
        redis,
        scripts=scripts,
        idempotency_ttl_ms=3_600_000,
        clock=clock,
        rate_limit=LIMIT,
        prefix=DEFAULT_PREFIX,
    )


async def snapshot(raw: Redis) -> dict[bytes, bytes | None]:
    """Every key in the database, serialized by Redis itself."""
    return {k: await raw.dump(k) for k in sorted([k async for k in raw.scan_iter()])}


async def attempt(
    engine: RedisEngine, buyer: str, *, key: str = "", quantity: int = 1, item_id: int = 1
) -> Reservation:
    return await engine.reserve(
        item_id,
        buyer=buyer,
        quantity=quantity,
        idempotency_key=key or f"{buyer}-{ids.next()}",
        order_id=ids.next(),
    )


async def count(engine: RedisEngine, redis: Redis, buyer: str) -> str | None:
    value: str | None = await redis.hget(engine.keys(1).rate(buyer), "count")  # type: ignore[misc]
    return value


async def test_the_attempt_past_the_limit_is_refused_and_writes_nothing(
    limited: RedisEngine, raw: Redis, clock: ManualClock
) -> None:
    await limited.load_item(open_item(total=10, limit=1))
    # Refusals count as attempts too: the first reserves, the next two reach the buyer's limit.
    assert (await attempt(limited, "alice")).accepted
    clock.advance(1_000)
    assert (await attempt(limited, "alice")).outcome is Outcome.LIMIT_REACHED
    clock.advance(1_500)
    assert (await attempt(limited, "alice")).outcome is Outcome.LIMIT_REACHED

    before = await snapshot(raw)
    refused = await attempt(limited, "alice")
    assert refused == Reservation(Outcome.RATE_LIMITED, retry_after_ms=60_000 - 2_500)
    assert not refused.accepted
    assert await snapshot(raw) == before  # not even the counter moved


async def test_another_buyer_and_another_item_are_unaffected(
    limited: RedisEngine, redis: Redis
) -> None:
    await limited.load_item(open_item(total=10, limit=5))
    await limited.load_item(open_item(item_id=2, total=10, limit=5))
    for _ in range(LIMIT.requests):
        assert (await attempt(limited, "alice")).accepted
    assert (await attempt(limited, "alice")).outcome is Outcome.RATE_LIMITED
    assert (await attempt(limited, "bob")).accepted
    assert (await attempt(limited, "alice", item_id=2)).accepted
    assert await count(limited, redis, "alice") == str(LIMIT.requests)
    assert await count(limited, redis, "bob") == "1"


async def test_the_next_window_allows_again(limited: RedisEngine, clock: ManualClock) -> None:
    await limited.load_item(open_item(total=10, limit=10))
    for _ in range(LIMIT.requests):
        assert (await attempt(limited, "alice")).accepted
    clock.advance(LIMIT.window_ms - 1)
    last_ms = await attempt(limited, "alice")
    assert (last_ms.outcome, last_ms.retry_after_ms) == (Outcome.RATE_LIMITED, 1)
    clock.advance(1)
    for _ in range(LIMIT.requests):  # a whole new window, opened by this attempt
        assert (await attempt(limited, "alice")).accepted
    assert (await attempt(limited, "alice")).retry_after_ms == LIMIT.window_ms
    stock = await limited.stock(1)
    assert stock is not None and stock.held == 2 * LIMIT.requests


async def test_replays_are_answered_and_not_counted(limited: RedisEngine, redis: Redis) -> None:
    await limited.load_item(open_item(total=10, limit=3))
    first = await attempt(limited, "alice", key="click")
    assert first.accepted
    for _ in range(10):
        again = await attempt(limited, "alice", key="click")
        assert (again.outcome, again.order_id, again.replayed) == (
            Outcome.RESERVED,
            first.order_id,
            True,
        )
    assert await count(limited, redis, "alice") == "1"
    for _ in range(LIMIT.requests - 1):  # the replays left the window's other attempts
        assert (await attempt(limited, "alice")).accepted
    assert (await attempt(limited, "alice")).outcome is Outcome.RATE_LIMITED
    # Over the limit, the recorded key is still answered: replayed, or key_reused.
    replay = await attempt(limited, "alice", key="click")
    assert (replay.outcome, replay.order_id, replay.replayed) == (
        Outcome.RESERVED,
        first.order_id,
        True,
    )
    reused = await attempt(limited, "alice", key="click", quantity=2)
    assert (reused.outcome, reused.order_id) == (Outcome.KEY_REUSED, first.order_id)
    assert await count(limited, redis, "alice") == str(LIMIT.requests)


async def test_attempts_before_the_sale_starts_count(
    limited: RedisEngine, clock: ManualClock
) -> None:
    item = dataclasses.replace(open_item(), starts_at_ms=clock.now_ms + 1_000)
    await limited.load_item(item)
    for _ in range(LIMIT.requests):
        assert (await attempt(limited, "eager")).outcome is Outcome.NOT_STARTED
    refused = await attempt(limited, "eager")
    assert (refused.outcome, refused.retry_after_ms) == (Outcome.RATE_LIMITED, LIMIT.window_ms)


async def test_errors_and_unknown_items_write_nothing(
    limited: RedisEngine, raw: Redis, clock: ManualClock
) -> None:
    await limited.load_item(open_item(total=10, limit=1))
    held = await attempt(limited, "holder")
    assert held.order_id
    before = await snapshot(raw)
    assert await raw.dbsize() == len(before)
    for _ in range(LIMIT.requests + 2):
        # Refused by the script (it needs the item's state), before the attempt is counted.
        with pytest.raises(InvalidRequest) as above:
            await attempt(limited, "alice", quantity=2)
        assert above.value.code is ErrorCode.QUANTITY_ABOVE_LIMIT
        with pytest.raises(InvalidRequest) as duplicate:
            await limited.reserve(
                1, buyer="alice", quantity=1, idempotency_key="k", order_id=held.order_id
            )
        assert duplicate.value.code is ErrorCode.DUPLICATE_ORDER_ID
        # Refused by Python, before any round trip.
        with pytest.raises(InvalidRequest):
            await attempt(limited, "alice", quantity=0)
        # No such item: no sale to count attempts for.
        assert (await attempt(limited, "alice", item_id=99)).outcome is Outcome.UNKNOWN_ITEM
    assert await snapshot(raw) == before
    assert await raw.dbsize() == len(before)
    # None of it counted: alice has her whole window.
    assert (await attempt(limited, "alice")).accepted


BAD_RATE_ARGS = [("0", "1000"), ("1.5", "1000"), ("5", "0"), ("5", str(MAX_HOLD_MS + 1)), ("5", "")]


@pytest.mark.parametrize(("requests", "window_ms"), BAD_RATE_ARGS)
async def test_the_script_refuses_a_bad_rate_limit_writing_nothing(
    engine: RedisEngine, scripts: Scripts, raw: Redis, requests: str, window_ms: str
) -> None:
    await engine.load_item(open_item())
    keys = engine.keys(1)
    args = ("1", "alice", "1", str(ids.next()), "60000", "", requests, window_ms)
    before = await snapshot(raw)
    with pytest.raises(InvalidRequest) as err:
        await scripts.call(
            ScriptName.RESERVE,
            (*keys.all_fixed(), keys.idempotency("alice", "k"), keys.rate("alice")),
            args,
        )
    assert err.value.code is ErrorCode.INVALID_RATE_LIMIT
    assert await snapshot(raw) == before


async def test_the_script_refuses_a_rate_limit_without_its_key(
    engine: RedisEngine, scripts: Scripts, raw: Redis
) -> None:
    await engine.load_item(open_item())
    keys = engine.keys(1)
    args = ("1", "alice", "1", str(ids.next()), "60000", "", "5", "1000")
    before = await snapshot(raw)
    with pytest.raises(InvalidRequest) as err:
        await scripts.call(
            ScriptName.RESERVE, (*keys.all_fixed(), keys.idempotency("alice", "k")), args
        )
    assert err.value.code is ErrorCode.INVALID_RATE_LIMIT
    assert await snapshot(raw) == before


@pytest.mark.parametrize(("requests", "window_ms"), [(0, 1000), (5, 0), (True, 1000), (5, 1.5)])
def test_python_refuses_a_bad_rate_limit(requests: int, window_ms: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        RateLimit(requests=requests, window_ms=window_ms)
    assert err.value.code is ErrorCode.INVALID_RATE_LIMIT


async def test_on_redis_time_the_counter_expires_with_its_window(
    redis: Redis, scripts: Scripts
) -> None:
    """In production there is no test clock: the window is Redis TIME, and the counter's
    PEXPIRE removes it when the window closes."""
    window = RateLimit(requests=2, window_ms=300)
    engine = RedisEngine(
        redis, scripts=scripts, idempotency_ttl_ms=60_000, rate_limit=window, prefix=DEFAULT_PREFIX
    )
    await engine.load_item(open_item(total=10, limit=10))
    assert (await attempt(engine, "alice")).accepted
    assert (await attempt(engine, "alice")).accepted
    refused = await attempt(engine, "alice")
    assert refused.outcome is Outcome.RATE_LIMITED
    assert refused.retry_after_ms is not None and 0 < refused.retry_after_ms <= window.window_ms
    assert 0 < await redis.pttl(engine.keys(1).rate("alice")) <= window.window_ms
    await asyncio.sleep(refused.retry_after_ms / 1000 + 0.05)
    assert await redis.exists(engine.keys(1).rate("alice")) == 0
    assert (await attempt(engine, "alice")).accepted


async def test_without_a_rate_limit_nothing_is_counted(engine: RedisEngine, redis: Redis) -> None:
    await engine.load_item(open_item(total=100, limit=100))
    for _ in range(20):
        assert (await attempt(engine, "alice")).accepted
    assert await redis.exists(engine.keys(1).rate("alice")) == 0
