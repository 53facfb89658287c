"""What the scripts write to a stream, decoded and encoded again, is what they wrote: recovery
puts lost events back with ``encode_order_event``, and a consumer must not tell them from the
scripts' own."""

from __future__ import annotations

import pytest

from seckill.domain.events import ORDER_EVENTS, ReleaseReason, decode_event, encode_order_event
from seckill.engine.engine import RedisEngine
from tests.conftest import open_item, pay

pytestmark = pytest.mark.redis_variants("redis7")


async def test_every_order_event_the_scripts_write_encodes_back_to_itself(
    engine: RedisEngine,
) -> None:
    await engine.load_item(open_item(total=10, limit=5, stock_shards=2))
    orders = []
    for n in range(1, 5):
        answer = await engine.reserve(
            1, buyer="alice", quantity=1, idempotency_key=f"k{n}", order_id=n,
            request_id="r1" if n == 1 else "",
        )  # fmt: skip
        orders.append(answer.order_id)
    await pay(engine, 1, orders[0])
    await pay(engine, 1, orders[0], payment_id="pay-again")  # charged twice: owed back
    await engine.release(1, orders[2], ReleaseReason.CANCELLED)

    kinds = set()
    for shard in range(2):
        for entry_id, fields in await engine.events(1, shard):
            event = decode_event(entry_id, fields, shard=shard)
            if event.kind in ORDER_EVENTS:
                assert encode_order_event(event) == fields, event
                kinds.add(event.kind)
            else:
                with pytest.raises(ValueError, match="not an order event"):
                    encode_order_event(event)
    assert kinds == ORDER_EVENTS
