"""Thousands of buyers at once: exactly the stock is sold, nobody passes the limit."""

from __future__ import annotations

import asyncio
from collections import Counter

from redis.asyncio import Redis

from seckill.domain.ids import OrderIds
from seckill.domain.items import Stock
from seckill.domain.outcomes import Outcome
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from seckill.redis_server import RedisServer
from tests.conftest import open_item

BUYERS = 5_000
UNITS = 100


async def test_5000_buyers_for_100_units(engine: RedisEngine, redis_server: RedisServer) -> None:
    await engine.load_item(open_item(total=UNITS, limit=1))
    ids = OrderIds(2)
    start = asyncio.Event()
    samples: list[Stock] = []

    async def buyer(n: int) -> list[Outcome]:
        await start.wait()
        # Each buyer tries twice with different keys: the second must hit the limit or sold out.
        return [
            (
                await engine.reserve(
                    1,
                    buyer=f"buyer-{n}",
                    quantity=1,
                    idempotency_key=f"try-{attempt}",
                    order_id=ids.next(),
                )
            ).outcome
            for attempt in range(2)
        ]

    async def sampler(done: asyncio.Event) -> None:
        # Its own connection, so the samples are not queued behind the buyers' pool.
        async with Redis.from_url(redis_server.url, decode_responses=True) as own:
            key = engine.keys(1).item
            while not done.is_set():
                total, available, held, sold = await own.hmget(
                    key, ["total", "available", "held", "sold"]
                )
                samples.append(Stock(int(total), int(available), int(held), int(sold)))

    done = asyncio.Event()
    watcher = asyncio.create_task(sampler(done))
    tasks = [asyncio.create_task(buyer(n)) for n in range(BUYERS)]
    start.set()
    results = await asyncio.gather(*tasks)
    done.set()
    await watcher

    outcomes = Counter(o for pair in results for o in pair)
    assert outcomes[Outcome.RESERVED] == UNITS
    assert set(outcomes) <= {Outcome.RESERVED, Outcome.SOLD_OUT, Outcome.LIMIT_REACHED}
    assert all(pair.count(Outcome.RESERVED) <= 1 for pair in results)
    assert len(samples) > 100, "the sampler hardly ran during the stampede"
    unbalanced = [s for s in samples if not s.balanced]
    assert not unbalanced
    assert await engine.stock(1) == Stock(total=UNITS, available=0, held=UNITS, sold=0)
    failed = [c for c in await audit_item(engine, 1) if not c.ok]
    assert not failed
