"""10,000 payments racing their own deadlines (and a reaper passing every 50 ms): each hold is
paid or released exactly once, stock comes back at most once, and a payment that loses the race
becomes refund_required."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from seckill.domain.events import ReleaseReason
from seckill.domain.holds import HoldState
from seckill.services.reconcile.records import compare_records
from tests.api.conftest import Api
from tests.support.polling import wait_until

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

RACES = 10_000
RATE_PER_S = 800  # new holds per second: about what the in-process HTTP path can pay for
AIM_MS = 150  # a racing payment is aimed within this of its hold's deadline, either side


async def test_10000_payments_racing_expiry(served: Api) -> None:
    api, rng = served, random.Random(7)
    item_id = await api.create_item(total=RACES, limit=1, hold_seconds=1)
    engine, ids = api.runtime.engine, api.runtime.order_ids
    # As many notices in flight as the client has connections: one waiting for a connection
    # would spend its request timeout there (each is answered once SQL holds it).
    in_flight = asyncio.Semaphore(100)

    async def race(n: int) -> tuple[int, str]:
        held = await engine.reserve(
            item_id, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=ids.next()
        )
        assert held.accepted and held.order_id and held.deadline_ms
        # Most payments race the deadline itself; a few are sent at once or well after it, so
        # both sides win some even on a machine slow enough to shift every race one way.
        fate = rng.random()
        if fate < 0.1:
            aim = time.time()
        elif fate < 0.2:
            aim = (held.deadline_ms + 4 * AIM_MS) / 1000
        else:
            aim = (held.deadline_ms + rng.uniform(-AIM_MS, AIM_MS)) / 1000
        await asyncio.sleep(max(0.0, aim - time.time()))
        async with in_flight:
            answer = await api.pay(item_id, str(held.order_id), f"pay-{held.order_id}")
        for _ in range(30):  # as a provider does: 503 not_durable is sent again, and replayed
            if answer.status_code != 503:
                break
            await asyncio.sleep(float(answer.headers["Retry-After"]))
            async with in_flight:
                answer = await api.pay(item_id, str(held.order_id), f"pay-{held.order_id}")
        assert answer.status_code == 200, answer.text
        return held.order_id, answer.json()["outcome"]

    tasks = []
    for n in range(RACES):
        tasks.append(asyncio.create_task(race(n)))
        if n % 40 == 39:
            await asyncio.sleep(40 / RATE_PER_S)
    results = dict(await asyncio.gather(*tasks))

    outcomes = Counter(results.values())
    assert outcomes.keys() == {"paid", "refund_required"}, outcomes  # both sides won sometimes
    await wait_until(_nothing_held(api, item_id), 10, "every hold settled")

    holds = await engine.holds(item_id)
    for order_id, outcome in results.items():
        hold = holds[order_id]
        if outcome == "paid":
            assert (hold.state, hold.refund_required) == (HoldState.PAID, False)
        else:
            assert hold.state is HoldState.RELEASED and hold.refund_required
            assert hold.reason is ReleaseReason.EXPIRED
    stock = await engine.stock(item_id)
    assert stock is not None and stock.balanced
    # Stock came back once per lost race: no more, no less.
    assert (stock.sold, stock.available, stock.held) == (
        outcomes["paid"],
        outcomes["refund_required"],
        0,
    )

    # SQL lands the same story: paid, or refund_required.
    async def landed() -> bool:
        answer = await api.http.get(f"/api/v1/admin/items/{item_id}", headers=api.as_admin)
        return bool(answer.json()["agree"]) and answer.json()["backlog"] == 0

    await wait_until(landed, 120, "the races landed in SQL")
    failed = [c for c in await compare_records(engine, api.runtime.ledger, item_id) if not c.ok]
    assert not failed, failed
    statuses = Counter(o.status for o in (await api.runtime.ledger.orders(item_id)).values())
    assert statuses == {"paid": outcomes["paid"], "refund_required": outcomes["refund_required"]}


def _nothing_held(api: Api, item_id: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        stock = await api.runtime.engine.stock(item_id)
        return stock is not None and stock.held == 0

    return check
