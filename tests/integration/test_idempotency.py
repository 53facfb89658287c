"""One idempotency key, many concurrent requests: one effect, identical answers."""

from __future__ import annotations

import asyncio

from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from tests.conftest import open_item


async def test_the_same_key_50_times_at_once(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=10, limit=3))
    ids = OrderIds(3)
    answers = await asyncio.gather(
        *(
            engine.reserve(
                1, buyer="alice", quantity=2, idempotency_key="click-1", order_id=ids.next()
            )
            for _ in range(50)
        )
    )
    seen = {(a.outcome, a.order_id, a.deadline_ms) for a in answers}
    assert len(seen) == 1
    assert seen.pop()[0] is Outcome.RESERVED
    assert sum(not a.replayed for a in answers) == 1
    stock = await engine.stock(1)
    assert stock is not None and (stock.available, stock.held) == (8, 2)
    assert len(await engine.holds(1)) == 1
    assert [e["event"] for _, e in await engine.events(1)] == ["loaded", "reserved"]


async def test_keys_are_scoped_per_buyer(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=10, limit=1))
    ids = OrderIds(3)
    a = await engine.reserve(1, buyer="a:b", quantity=1, idempotency_key="c", order_id=ids.next())
    b = await engine.reserve(1, buyer="a", quantity=1, idempotency_key="b:c", order_id=ids.next())
    assert a.accepted and b.accepted and a.order_id != b.order_id


async def test_a_key_reused_for_another_quantity_changes_nothing(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=10, limit=3))
    ids = OrderIds(3)
    first = await engine.reserve(1, buyer="a", quantity=1, idempotency_key="k", order_id=ids.next())
    other = await engine.reserve(1, buyer="a", quantity=2, idempotency_key="k", order_id=ids.next())
    assert other.outcome is Outcome.KEY_REUSED and other.order_id == first.order_id
    stock = await engine.stock(1)
    assert stock is not None and stock.held == 1


async def test_a_rejection_is_not_recorded_so_a_retry_is_decided_afresh(
    engine: RedisEngine,
) -> None:
    await engine.load_item(open_item(total=1, limit=1))
    ids = OrderIds(3)
    holder = await engine.reserve(
        1, buyer="a", quantity=1, idempotency_key="k", order_id=ids.next()
    )
    retry = dict(buyer="b", quantity=1, idempotency_key="k")
    assert (await engine.reserve(1, **retry, order_id=ids.next())).outcome is Outcome.SOLD_OUT
    assert holder.order_id
    await engine.release(1, holder.order_id, "cancelled")  # type: ignore[arg-type]
    assert (await engine.reserve(1, **retry, order_id=ids.next())).accepted
