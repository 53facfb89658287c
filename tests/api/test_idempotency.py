"""Idempotency-Key over HTTP: one effect per key and buyer, the same answer on every repeat."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.api.conftest import Api

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

TRIALS = 200
PARALLEL = 20


async def test_20_parallel_repeats_have_one_effect_and_one_answer(api: Api) -> None:
    item_id = await api.create_item(total=TRIALS * 2)
    for trial in range(TRIALS):
        buyer, key = f"buyer-{trial}", f"key-{trial}"
        answers = await asyncio.gather(*(api.buy(item_id, buyer, key) for _ in range(PARALLEL)))
        statuses = Counter(a.status_code for a in answers)
        # Decided ones answer 202 with one body; a repeat that arrives while the first is still
        # being decided gets the draft's 409 and may retry.
        assert statuses.keys() <= {202, 409}, statuses
        assert statuses[202] >= 1
        bodies = {a.body for a in answers if a.status_code == 202}
        assert len(bodies) == 1, bodies
        busy = {a.json()["error"] for a in answers if a.status_code == 409}
        assert busy <= {"request_in_flight"}, busy
        retried = await api.buy(item_id, buyer, key)  # a completed repeat
        assert (retried.status_code, retried.body) == (202, bodies.pop())
    units = await api.runtime.engine.buyer_units(item_id)
    assert units == {f"buyer-{t}": 1 for t in range(TRIALS)}  # one effect per key
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == TRIALS


async def test_the_key_is_required_and_bound_to_its_body(api: Api) -> None:
    item_id = await api.create_item(total=10, limit=3)
    headers = api.as_buyer("alice")
    missing = await api.http.post(f"/api/v1/items/{item_id}/orders", headers=headers, json={})
    assert missing.status_code == 400
    assert missing.json()["error"] == "idempotency_key_required"
    first = await api.buy(item_id, "alice", '"8e03978e-40d5"', quantity=1)
    assert first.status_code == 202
    assert (await api.buy(item_id, "alice", "8e03978e-40d5")).body == first.body  # sf-string
    other_body = await api.buy(item_id, "alice", "8e03978e-40d5", quantity=2)
    assert other_body.status_code == 422
    assert other_body.json()["error"] == "key_reused"
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == 1


async def test_keys_are_scoped_per_buyer(api: Api) -> None:
    item_id = await api.create_item(total=10)
    alice = await api.buy(item_id, "alice", "same-key")
    bob = await api.buy(item_id, "bob", "same-key")
    assert alice.status_code == bob.status_code == 202
    assert alice.json()["order_id"] != bob.json()["order_id"]
