"""GET /api/v1/items/{id} through HTTP: the record from the cache, `available` read live, unknown
ids answered 404 and cached as absent."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import pytest

from seckill.engine.keys import item_card_key
from tests.api.conftest import Api
from tests.integration.test_item_cache import SqlCounter

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]


async def test_an_item_reads_as_recorded_with_live_available(api: Api) -> None:
    sql = SqlCounter(api.runtime.request_ledger.engine)
    item_id = await api.create_item(total=5, limit=2, hold_seconds=90)
    record = await api.runtime.ledger.item(item_id)
    assert record is not None
    queries_to_create = sql.total

    answers = await asyncio.gather(*(api.http.get(f"/api/v1/items/{item_id}") for _ in range(50)))

    assert {a.status_code for a in answers} == {200}
    body = answers[0].json()
    assert {
        k: v for k, v in body.items() if k not in {"starts_at", "ends_at"}
    } == {
        "item_id": item_id, "name": "Test phone", "price_cents": 19_900, "currency": "USD",
        "total": 5, "per_buyer_limit": 2, "hold_seconds": 90, "stock_shards": 1,
        "waiting_room": False, "queue_admit_per_second": None, "queue_open_seconds": None,
        "available": 5,
    }  # fmt: skip
    assert datetime.fromisoformat(body["starts_at"]) == record.starts_at
    assert datetime.fromisoformat(body["ends_at"]) == record.ends_at
    assert all(a.json() == body for a in answers)
    # Creating and warming the item wrote its card: the readers never reached SQL.
    assert sql.total == queries_to_create

    bought = await api.buy(item_id, "alice", "first", quantity=2)
    assert bought.status_code == 202, bought.text
    after = await api.http.get(f"/api/v1/items/{item_id}")
    assert after.status_code == 200
    assert after.json() == {**body, "available": 3}  # the record cached, the units left live


async def test_an_unknown_item_is_404_and_cached_as_absent(api: Api) -> None:
    sql = SqlCounter(api.runtime.request_ledger.engine)
    unknown = 987_654_321

    answers = await asyncio.gather(*(api.http.get(f"/api/v1/items/{unknown}") for _ in range(30)))
    again = await api.http.get(f"/api/v1/items/{unknown}")

    assert {a.status_code for a in [*answers, again]} == {404}
    assert {a.json()["error"] for a in [*answers, again]} == {"unknown_item"}
    assert sql.per_id[unknown] == 1
    key = item_card_key(unknown, api.settings.key_prefix)
    assert json.loads(await api.runtime.redis.get(key))["absent"] is True
    ttl_ms = await api.runtime.redis.pttl(key)
    assert 0 < ttl_ms <= api.settings.item_absent_seconds * 1000


async def test_an_id_cached_as_absent_is_found_once_created(api: Api) -> None:
    first = await api.create_item(total=1)
    probe = first + 1  # the next id SQLite hands out
    assert (await api.http.get(f"/api/v1/items/{probe}")).status_code == 404

    created = await api.create_item(total=3)
    assert created == probe
    found = await api.http.get(f"/api/v1/items/{probe}")
    assert found.status_code == 200, found.text
    assert found.json()["available"] == 3
