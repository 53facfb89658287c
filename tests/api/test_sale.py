"""A whole sale through HTTP: a crowd buys, some pay, some cancel, some fail to pay, some let the
hold run out; the released units are bought again; after the stream drains, Redis and SQL agree
and every invariant holds."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from seckill.engine.audit import audit_item
from seckill.services.reconcile.records import compare_records
from tests.api.conftest import Answer, Api
from tests.support.polling import wait_until

# One Redis (the engine suites cover both versions) with every SQL backend; the cluster with one
# (the SQL side does not change with the Redis behind it, and each sale waits out its holds).
pytestmark = pytest.mark.redis_variants("redis7")
on_a_cluster = pytest.mark.redis_variants("cluster")
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

BUYERS = 3_000
UNITS = 100
HOLD_SECONDS = 12  # outlasts the rush and the settling, on a slow machine too


async def counters(api: Api, item_id: int) -> dict[str, object]:
    answer = await api.http.get(f"/api/v1/admin/items/{item_id}", headers=api.as_admin)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def crowd(
    api: Api, item_id: int, buyers: list[str], wave: str, *, pay: bool = False
) -> dict[str, str]:
    """Every buyer tries once, all at once (and pays at once, if ``pay``); returns buyer ->
    order id for those who got one."""

    async def attempt(buyer: str) -> Answer:
        answer = await api.buy(item_id, buyer, f"{wave}-{buyer}")
        if pay and answer.status_code == 202:
            order_id = answer.json()["order_id"]
            paid = await api.pay(item_id, order_id, f"{wave}-pay-{order_id}")
            assert paid.json()["outcome"] == "paid", paid.text
        return answer

    # Tickets first, so the rush itself is only purchases (and fits well within a hold).
    await asyncio.gather(*(api.ticket(item_id, b) for b in buyers))
    answers = await asyncio.gather(*(attempt(b) for b in buyers))
    statuses = Counter(a.status_code for a in answers)
    assert statuses.keys() <= {202, 409}, statuses
    refusals = {a.json()["error"] for a in answers if a.status_code == 409}
    assert refusals <= {"sold_out"}, refusals
    return {
        b: a.json()["order_id"]
        for b, a in zip(buyers, answers, strict=True)
        if a.status_code == 202
    }


async def test_a_sale_end_to_end(served: Api) -> None:
    await run_sale(served, stock_shards=1)


@on_a_cluster
@sqlite_only
async def test_a_sale_end_to_end_on_a_cluster(served: Api) -> None:
    await run_sale(served, stock_shards=1)


@on_a_cluster
@sqlite_only
async def test_a_sale_over_four_stock_shards_end_to_end(served: Api) -> None:
    """The same sale, its stock over four shards: the same answers, counters and records (the
    admin counters show the item across its shards, and each shard's own)."""
    item_id = await run_sale(served, stock_shards=4)
    shards = (await counters(served, item_id))["shards"]
    assert isinstance(shards, list) and len(shards) == 4
    assert sum(s["sold"] for s in shards) == UNITS
    assert all(s["available"] == s["held"] == 0 for s in shards)


async def run_sale(api: Api, *, stock_shards: int) -> int:
    """The sale, checked from start to end; returns its item's id."""
    rng = random.Random(4)
    item_id = await api.create_item(
        total=UNITS, limit=1, hold_seconds=HOLD_SECONDS, stock_shards=stock_shards
    )
    buyers = [f"buyer-{n}" for n in range(BUYERS)]

    winners = await crowd(api, item_id, buyers, "first")
    assert len(winners) == UNITS  # exactly the stock, not one more
    after_rush = await counters(api, item_id)
    assert after_rush["redis"] == {"total": UNITS, "available": 0, "held": UNITS, "sold": 0}

    fates = ["pay"] * 40 + ["cancel"] * 20 + ["fail"] * 10 + ["expire"] * 30
    rng.shuffle(fates)
    plan = dict(zip(winners.items(), fates, strict=True))

    async def settle(buyer: str, order_id: str, fate: str) -> str:
        if fate == "pay":
            answer = await api.pay(item_id, order_id, f"pay-{order_id}")
            assert answer.status_code == 200, answer.text
            return str(answer.json()["outcome"])  # paid, or refund_required if the hold ran out
        if fate == "fail":
            answer = await api.pay(item_id, order_id, f"fail-{order_id}", succeeded=False)
            assert answer.status_code == 200, answer.text
            return str(answer.json()["outcome"])
        if fate == "cancel":
            answer = await api.http.post(
                f"/api/v1/items/{item_id}/orders/{order_id}/cancel", headers=api.as_buyer(buyer)
            )
            assert answer.status_code == 200, answer.text
            return str(answer.json()["status"])
        return "left"

    outcomes = Counter(await asyncio.gather(*(settle(b, o, fate) for (b, o), fate in plan.items())))
    paid = outcomes["paid"]
    assert paid >= 1, outcomes  # the crowd is far quicker than the hold
    released_now = outcomes["released"]  # cancelled and failed payments

    # The reaper releases what was left unpaid within one interval of the deadline.
    async def nothing_held() -> bool:
        return (await counters(api, item_id))["redis"]["held"] == 0  # type: ignore[index,no-any-return]

    await wait_until(nothing_held, HOLD_SECONDS + 10, "unpaid holds released")
    returned = UNITS - paid
    assert returned == released_now + outcomes["left"] + outcomes["refund_required"]
    snapshot = await counters(api, item_id)
    assert snapshot["redis"] == {"total": UNITS, "available": returned, "held": 0, "sold": paid}

    # The units that came back are sold again, to buyers who missed out the first time.
    losers = [b for b in buyers if b not in winners]
    second = await crowd(api, item_id, losers, "second", pay=True)
    assert len(second) == returned

    # Everything lands: SQL agrees with Redis, order for order, and the invariants hold.
    async def landed() -> bool:
        state = await counters(api, item_id)
        return bool(state["agree"]) and state["backlog"] == 0

    await wait_until(landed, 60, "the stream landed in SQL")
    state = await counters(api, item_id)
    assert state["sql"] == {"total": UNITS, "available": 0, "held": 0, "sold": UNITS}
    engine, ledger = api.runtime.engine, api.runtime.ledger
    failed = [c for c in await audit_item(engine, item_id, journal=False) if not c.ok]
    failed += [c for c in await compare_records(engine, ledger, item_id) if not c.ok]
    assert not failed, failed
    statuses = Counter(o.status for o in (await ledger.orders(item_id)).values())
    assert statuses["paid"] == UNITS
    assert statuses["released"] + statuses["refund_required"] == returned

    # Every buyer sees their own order, in the state SQL has.
    orders = {**winners, **second}
    views = await asyncio.gather(
        *(
            api.http.get(f"/api/v1/items/{item_id}/orders/{o}", headers=api.as_buyer(b))
            for b, o in orders.items()
        )
    )
    assert {v.status_code for v in views} == {200}
    landed = await ledger.orders(item_id)
    assert all(v.json()["status"] == landed[int(v.json()["order_id"])].status for v in views)
    return item_id
