"""What the operator's console does over HTTP, beside the CLI and through the same services: an
item's drift looked at (nothing changed by the look) and repaired (journaled), dead letters
replayed and dropped, a sale ended early; each for an admin only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from seckill.domain.ids import OrderIds
from tests.api.conftest import Api

pytestmark = pytest.mark.redis_variants("redis7")


async def admin_post(api: Api, path: str, body: dict[str, Any] | None = None) -> Any:
    answer = await api.http.post(path, headers=api.as_admin, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def drift(api: Api, item_id: int) -> Any:
    answer = await api.http.get(f"/api/v1/admin/items/{item_id}/drift", headers=api.as_admin)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.redis_variants("redis7", "cluster")
async def test_drift_is_looked_at_then_repaired(api_alone: Api, redis: Redis) -> None:
    api = api_alone  # no persister: SQL holds only what the test writes
    item_id = await api.create_item(total=10)
    assert (await api.buy(item_id, "alice", "k1")).status_code == 202
    first = await drift(api, item_id)
    # Nothing landed in SQL (no persister here): the hold is Redis's alone, and no drift yet.
    assert first["agree"] is True and first["found"] == [] and first["repairs"] == []
    assert first["redis"] == {"total": 10, "available": 9, "held": 1, "sold": 0}

    await redis.hincrby(api.runtime.engine.keys(item_id).item, "held", 4)
    looked = await drift(api, item_id)
    assert looked["agree"] is False and looked["repairs"] == []
    assert {f["kind"] for f in looked["found"]} == {"redis_counters"}
    assert looked["left"] == looked["found"]
    # A look changes nothing: the counter is still off, and the item still sells.
    assert await drift(api, item_id) == looked
    assert (await api.buy(item_id, "bob", "k2")).status_code == 202

    repaired = await admin_post(api, f"/api/v1/admin/items/{item_id}/repair")
    assert {r["kind"] for r in repaired["repairs"]} == {"redis_counters"}
    assert repaired["agree"] is True and repaired["left"] == []
    assert repaired["redis"] == {"total": 10, "available": 8, "held": 2, "sold": 0}
    journal = await api.runtime.ledger.repairs(item_id)
    assert {r.kind for r in journal} == {"redis_counters"}
    assert (await drift(api, item_id))["agree"] is True


async def test_dead_letters_are_replayed_and_dropped(api_alone: Api) -> None:
    api = api_alone  # no persister: the dead letters are the test's own
    item_id = await api.create_item(total=5)
    engine, ledger = api.runtime.engine, api.runtime.ledger
    await engine.reserve(
        item_id, buyer="alice", quantity=1, idempotency_key="k", order_id=OrderIds(8).next()
    )
    [(entry_id, fields)] = [e for e in await engine.events(item_id) if e[1]["event"] == "reserved"]
    keys = engine.keys(item_id)
    # The persister gave up on a good entry (SQL was away) and on one it cannot read.
    await ledger.add_dead_letter(
        stream=keys.events, entry_id=entry_id, payload=fields, error="timeout", deliveries=5
    )
    await ledger.add_dead_letter(
        stream=keys.events, entry_id="1-1", payload={"event": "nonsense"}, error="bad",
        deliveries=5,
    )  # fmt: skip
    good, bad = sorted(await ledger.dead_letters(), key=lambda letter: letter.entry_id != entry_id)

    replayed = await admin_post(
        api, "/api/v1/admin/dead-letters/replay", {"ids": [good.id, bad.id, "404"]}
    )
    assert replayed["ok"] is False and replayed["missing"] == ["404"]
    outcome = {letter["id"]: letter["refused"] for letter in replayed["letters"]}
    assert outcome[good.id] is None and outcome[bad.id]  # why it cannot land
    assert list(await ledger.orders(item_id)) == [int(fields["order_id"])]
    [pending] = await ledger.dead_letters()
    assert pending.id == bad.id

    dropped = await admin_post(api, "/api/v1/admin/dead-letters/drop", {"ids": [bad.id]})
    assert dropped == {"ok": True, "missing": [], "letters": [{"id": bad.id, "refused": None}]}
    assert await ledger.dead_letters() == []
    settled = {letter.id: letter for letter in await ledger.dead_letters(include_settled=True)}
    assert settled[bad.id].dropped_at is not None and settled[good.id].replayed_at is not None


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/admin/items/{item}/drift", None),
        ("POST", "/api/v1/admin/items/{item}/repair", None),
        ("POST", "/api/v1/admin/dead-letters/replay", {"ids": ["1"]}),
        ("POST", "/api/v1/admin/dead-letters/drop", {"ids": ["1"]}),
    ],
)
async def test_only_an_admin_may(api: Api, method: str, path: str, body: Any) -> None:
    item_id = await api.create_item(total=1)
    url = path.format(item=item_id)
    answer = await api.http.request(method, url, headers=api.as_buyer("mallory"), json=body)
    assert answer.status_code == 403, answer.text
    nobody = await api.http.request(method, url, json=body)
    assert nobody.status_code == 401, nobody.text


async def test_unknown_items_and_bad_bodies_are_refused(api: Api) -> None:
    for method, path in (("GET", "drift"), ("POST", "repair")):
        answer = await api.http.request(
            method, f"/api/v1/admin/items/999999/{path}", headers=api.as_admin
        )
        assert answer.status_code == 404 and answer.json()["error"] == "unknown_item", answer.text
    for body in ({"ids": []}, {"ids": ["1"], "extra": 1}, {"ids": "1"}, {}):
        answer = await api.http.post(
            "/api/v1/admin/dead-letters/drop", headers=api.as_admin, json=body
        )
        assert answer.status_code == 422, (body, answer.text)


@pytest.mark.redis_variants("redis7", "cluster")
@pytest.mark.parametrize("shards", [1, 2])
async def test_a_sale_ended_early(api: Api, shards: int) -> None:
    item_id = await api.create_item(total=10, stock_shards=shards)
    held = await api.buy(item_id, "alice", "k1")
    assert held.status_code == 202, held.text
    await api.ticket(item_id, "bob")  # taken before the end, refused at the purchase after it

    ended = await admin_post(api, f"/api/v1/admin/items/{item_id}/end")
    ends_at = datetime.fromisoformat(ended["ends_at"])
    assert ends_at <= datetime.now(UTC)
    for buyer in ("bob", "carol"):  # every shard refuses
        refused = await api.buy(item_id, buyer, f"k-{buyer}")
        assert refused.status_code == 403 and refused.json()["error"] == "ended", refused.text
    ticket = await api.issue_ticket(item_id, "dave")
    assert ticket.status_code == 403 and ticket.json()["error"] == "ended", ticket.text
    # A hold taken before the end is still paid; nothing else moved.
    paid = await api.pay(item_id, held.json()["order_id"], "pay-1")
    assert paid.status_code == 200 and paid.json()["outcome"] == "paid", paid.text
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held, stock.sold) == (9, 0, 1)

    again = await admin_post(api, f"/api/v1/admin/items/{item_id}/end")
    assert datetime.fromisoformat(again["ends_at"]) == ends_at  # the first end stands
    record = await api.runtime.ledger.item(item_id)
    assert record is not None and record.ends_at == ends_at


async def test_only_a_sale_on_may_end(api: Api) -> None:
    later = await api.create_item(total=1, starts_in=timedelta(hours=1), ends_in=timedelta(hours=2))
    refused = await api.http.post(f"/api/v1/admin/items/{later}/end", headers=api.as_admin)
    assert refused.status_code == 409 and refused.json()["error"] == "sale_not_started"
    record = await api.runtime.ledger.item(later)
    assert record is not None and record.ends_at > datetime.now(UTC) + timedelta(hours=1)
    unknown = await api.http.post("/api/v1/admin/items/999999/end", headers=api.as_admin)
    assert unknown.status_code == 404
    buyer = await api.http.post(f"/api/v1/admin/items/{later}/end", headers=api.as_buyer("m"))
    assert buyer.status_code == 403
