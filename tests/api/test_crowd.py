"""The crowd that ``seckill demo`` and ``seckill bench`` send: its verdicts pass on a clean
sale (through a waiting room too), and each planted fault fails the verdict that should catch it,
by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis
from rich.console import Console
from sqlalchemy import delete

from seckill.bootstrap.keys import token_codec
from seckill.bootstrap.workers import WorkerKind
from seckill.crowd.client import ApiClient, Credentials
from seckill.crowd.plan import CrowdPlan, QueuePlan
from seckill.crowd.rehearsal import Rehearsal, rehearse
from seckill.crowd.sale import Sale, open_sale
from seckill.engine.audit import Check
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.store.ledger import Ledger
from seckill.store.tables import Order
from tests.api.conftest import PAYMENT_SECRET, Api, api_settings, running_api
from tests.conftest import RedisTarget, redis_settings

# One Redis (the engine suites cover both versions); every SQL backend.
pytestmark = pytest.mark.redis_variants("redis7")

PLAN = CrowdPlan(
    buyers=120, late_buyers=40, units=12, per_buyer_limit=2, hold_seconds=1, concurrency=16
)


def credentials(api: Api) -> Credentials:
    return Credentials(tokens=token_codec(api.settings), payment_secret=PAYMENT_SECRET)


async def rush(api: Api, sql_url: str, queue: QueuePlan | None = None) -> Rehearsal:
    return await rehearse(
        api.http.base_url, PLAN, credentials(api), kind="bench", console=Console(quiet=True),
        database_url=sql_url, queue=queue,
        prefix=DEFAULT_PREFIX,
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


QUEUE_FRONT_S = 0.2
QUEUE_VERDICTS = {
    "admitted in position order",
    "pre-start joiners in random order",
    "positions unique and contiguous",
    "nobody left waiting",
    "sold out reached everyone",
}


@pytest.fixture
async def queued(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """``served``, with a waiting room and its inlet paced for ``PLAN``: a turn as long as a
    hold, two admissions per unit in it, a turn's worth a second."""
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=tmp_path,
        reaper_interval_seconds=0.05,
        ticket_ttl_seconds=600,
        waiting_room=True,
        queue_admit_per_second=2 * PLAN.units,
        queue_admit_per_unit=2,
        queue_turn_seconds=PLAN.hold_seconds,
        queue_inlet_interval_seconds=0.05,
        queue_front_seconds=QUEUE_FRONT_S,
    )
    workers = (WorkerKind.PERSISTER, WorkerKind.REAPER, WorkerKind.INLET)
    async with running_api(settings, workers=workers) as live:
        yield live


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_a_crowd_through_the_waiting_room_passes_and_a_stranger_is_named(
    queued: Api, sql_url: str
) -> None:
    done = await rush(queued, sql_url, QueuePlan(lead_s=1.5, front_s=QUEUE_FRONT_S))
    result = done.result
    failed = [v for v in result["verdicts"] if not v["ok"]]
    assert not failed, failed
    assert {v["name"] for v in result["verdicts"]} >= QUEUE_VERDICTS
    room = result["waiting_room"]
    everyone = PLAN.buyers + PLAN.late_crowd
    assert room["joined"] == room["length"] == everyone
    assert room["joined_before_start"] == room["drawn"] == PLAN.buyers  # joined in 1.5 s
    assert room["rank_correlation"] is not None and room["left_waiting"] == 0
    assert (
        0 < room["admitted_up_to"] < everyone
        and room["admissions"]["upto"][-1] == (room["admitted_up_to"])
    )
    assert len(room["tickets"]["t_s"]) >= PLAN.units // PLAN.per_buyer_limit
    seen = {(row["action"], row["outcome"]) for row in result["outcomes"]}
    assert {("join", "waiting"), ("poll", "admitted"), ("poll", "sold_out")} <= seen

    # Someone the crowd does not know of takes a place: the positions no longer add up.
    stranger = await queued.http.post(
        f"/api/v1/items/{done.sale.item_id}/queue", headers=queued.as_buyer("stranger")
    )
    assert stranger.status_code == 200 and stranger.json()["position"] == everyone + 1
    checks = await audit_again(queued, done.sale, sql_url)
    positions = checks["positions unique and contiguous"]
    assert not positions.ok
    assert f"1 held by nobody ({everyone + 1})" in positions.detail
    assert checks["admitted in position order"].ok and checks["nobody left waiting"].ok


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_the_crowd_makes_its_item_with_a_room_of_its_own_or_none(served: Api) -> None:
    async with aiohttp.ClientSession() as http:  # the deployment's default: no room
        client = ApiClient(http, served.http.base_url, credentials(served))
        queued = await open_sale(client, PLAN, kind="bench", queue=QueuePlan(admit_per_second=7))
        direct = await open_sale(client, PLAN, kind="bench")
    cards = [
        (await served.http.get(f"/api/v1/items/{sale.item_id}")).json() for sale in (queued, direct)
    ]
    assert [(c["waiting_room"], c["queue_admit_per_second"]) for c in cards] == [
        (True, 7), (False, None)
    ]  # fmt: skip
