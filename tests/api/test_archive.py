"""Archiving through the API: refused with the reasons while a hold is held, then done; every
read of the archived item answers from SQL and a late payment is a refund."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from seckill.engine.keys import DEFAULT_PREFIX, items_registry
from tests.api.conftest import Api
from tests.support.polling import wait_until

pytestmark = pytest.mark.redis_variants("redis7")


async def test_an_item_archived_through_the_api_is_answered_from_sql(served: Api) -> None:
    item_id = await served.create_item(total=5, ends_in=timedelta(seconds=2))
    paid = (await served.buy(item_id, "alice", "k-alice")).json()["order_id"]
    held = (await served.buy(item_id, "bob", "k-bob")).json()["order_id"]
    assert (await served.pay(item_id, paid, "pay-alice")).status_code == 200
    await asyncio.sleep(2.1)  # the sale is over; bob's hold is still held

    refused = await served.http.post(
        f"/api/v1/admin/items/{item_id}/archive", headers=served.as_admin
    )

    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "item_unsettled"
    assert "held: 1 units held" in refused.json()["message"]
    listed = await served.http.get("/api/v1/admin/items?limit=1", headers=served.as_admin)
    [row] = listed.json()["items"]  # the newest
    assert row["item_id"] == item_id
    reasons = [u["reason"] for u in row["unsettled"]]
    assert (row["stage"], reasons) == ("ended", ["in_grace", "held"])

    assert (await served.pay(item_id, held, "pay-bob-1", succeeded=False)).status_code == 200

    async def archived() -> bool:
        done = await served.http.post(
            f"/api/v1/admin/items/{item_id}/archive", headers=served.as_admin
        )
        return done.status_code == 200 and done.json()["removed"]

    await wait_until(archived, 15, "archived once the release landed")
    redis = served.runtime.redis
    assert str(item_id) not in await redis.smembers(items_registry(DEFAULT_PREFIX))  # type: ignore[misc]
    listed = await served.http.get("/api/v1/admin/items?limit=1", headers=served.as_admin)
    [row] = listed.json()["items"]  # the newest
    assert row["item_id"] == item_id
    assert (row["stage"], row["unsettled"]) == ("archived", [])
    assert row["archived_at"] is not None

    card = await served.http.get(f"/api/v1/items/{item_id}")
    assert (card.status_code, card.json()["available"]) == (200, 4)
    order = await served.http.get(
        f"/api/v1/items/{item_id}/orders/{paid}", headers=served.as_buyer("alice")
    )
    assert (order.status_code, order.json()["status"]) == (200, "paid")
    late = await served.pay(item_id, held, "pay-bob-2")
    assert late.status_code == 200, late.text
    assert (late.json()["outcome"], late.json()["order_status"]) == (
        "refund_required", "refund_required"
    )  # fmt: skip
    counters = await served.http.get(f"/api/v1/admin/items/{item_id}", headers=served.as_admin)
    assert counters.json()["redis"] is None
    assert counters.json()["sql"] == {"total": 5, "available": 4, "held": 0, "sold": 1}
    audit = await served.http.get(f"/api/v1/admin/items/{item_id}/audit", headers=served.as_admin)
    assert audit.json()["passed"], audit.text
    warm = await served.http.post(f"/api/v1/admin/items/{item_id}/warm", headers=served.as_admin)
    assert (warm.status_code, warm.json()["error"]) == (409, "item_archived")
