"""The crowd that ``seckill demo`` and ``seckill bench`` send: its verdicts pass on a clean
sale, and each planted fault fails the verdict that should catch it, by name."""

from __future__ import annotations

import aiohttp
import pytest
from rich.console import Console
from sqlalchemy import delete

from seckill.crowd.client import ApiClient, Credentials
from seckill.crowd.plan import CrowdPlan
from seckill.crowd.rehearsal import Rehearsal, rehearse
from seckill.crowd.sale import Sale
from seckill.engine.audit import Check
from seckill.security.tokens import token_codec
from seckill.store.tables import Order
from tests.api.conftest import PAYMENT_SECRET, Api

# One Redis (the engine suites cover both versions); every SQL backend.
pytestmark = pytest.mark.redis_variants("redis7")

PLAN = CrowdPlan(
    buyers=120, late_buyers=40, units=12, per_buyer_limit=2, hold_seconds=1, concurrency=16
)


def credentials(api: Api) -> Credentials:
    return Credentials(tokens=token_codec(api.settings), payment_secret=PAYMENT_SECRET)


async def rush(api: Api, sql_url: str) -> Rehearsal:
    return await rehearse(
        api.http.base_url, PLAN, credentials(api), kind="bench", console=Console(quiet=True),
        database_url=sql_url,
    )  # fmt: skip


async def audit_again(api: Api, sale: Sale, sql_url: str) -> dict[str, Check]:
    async with aiohttp.ClientSession() as http:
        client = ApiClient(http, api.http.base_url, credentials(api))
        checks = await sale.audit(client, database_url=sql_url)
    return {c.name: c for c in checks}


async def test_a_clean_sale_passes_every_verdict(served: Api, sql_url: str) -> None:
    done = await rush(served, sql_url)
    result = done.result
    failed = [v for v in result["verdicts"] if not v["ok"]]
    assert not failed, failed
    assert result["passed"]
    names = {v["name"] for v in result["verdicts"]}
    assert {"not oversold", "buyers within limit", "no lost orders", "no duplicate orders",
            "payments counted once", "released units resold or on sale", "Redis == SQL",
            "server audit"} <= names  # fmt: skip
    # The crowd did what the plan says: it sold out, and every kind of answer came back.
    seen = {(row["action"], row["outcome"]) for row in result["outcomes"]}
    assert {("buy", "reserved"), ("pay", "paid"), ("buy", "sold_out")} <= seen
    assert result["stock"]["sold"][-1] > 0 and result["stock"]["held"][-1] == 0
    assert sum(row["count"] for row in result["outcomes"]) == result["requests"]


async def test_a_deleted_order_row_is_named(served: Api, sql_url: str) -> None:
    done = await rush(served, sql_url)
    assert done.result["passed"]
    victim = next(o for o in done.sale.log.orders.values() if o.status == "paid")
    async with served.runtime.ledger.engine.begin() as conn:
        await conn.execute(delete(Order).where(Order.id == int(victim.order_id)))

    checks = await audit_again(served, done.sale, sql_url)

    lost = checks["no lost orders"]
    assert not lost.ok
    assert f"order {victim.order_id} missing in SQL" in lost.detail
    assert not checks["server audit"].ok
    assert "every order in SQL" in checks["server audit"].detail
    assert checks["not oversold"].ok  # the counters were not touched


async def test_a_corrupted_counter_is_named(served: Api, sql_url: str) -> None:
    done = await rush(served, sql_url)
    assert done.result["passed"]
    assert done.sale.final is not None
    available = done.sale.final["redis"]["available"]
    item = served.runtime.engine.keys(done.sale.item_id)
    await served.runtime.redis.hincrby(item.item, "available", 1)

    checks = await audit_again(served, done.sale, sql_url)

    oversold = checks["not oversold"]
    assert not oversold.ok
    assert f"Redis: available {available + 1} + held 0 + sold" in oversold.detail
    assert not checks["Redis == SQL"].ok
    assert "stock balanced" in checks["server audit"].detail
    assert checks["no lost orders"].ok
