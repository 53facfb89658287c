"""A purchase answered 202 whose write Redis lost before the persister landed it (``fast``
durability) is gone on both sides. Once the item is rebuilt from SQL (by the reconciler, or an
operator's `seckill recover`), a buyer who reads or cancels it is told 410 ``order_lost``, not a
404 that reads like a typo; an id never issued, or an order of another item, stays 404, and an
order that landed reads as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from seckill.bootstrap.workers import WorkerKind, build_worker
from seckill.domain.ids import OrderIds, wall_clock_ms
from seckill.domain.outcomes import Outcome
from seckill.services.reconcile.recovery import recover_item
from seckill.store.ledger import Ledger
from tests.api.conftest import Answer, Api, api_settings, running_api
from tests.conftest import RedisTarget, flush, redis_settings

pytestmark = pytest.mark.redis_variants("redis7", "cluster")


@pytest.fixture
async def bare(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """A live API and no worker: an order lands in SQL only when the test runs the persister."""
    settings = api_settings(**redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path)
    async with running_api(settings) as live:
        yield live


async def buy(api: Api, item_id: int, buyer: str) -> str:
    answer = await api.buy(item_id, buyer, f"{buyer}-key")
    assert answer.status_code == 202, answer.text
    return str(answer.json()["order_id"])


async def land(api: Api, *order_ids: str) -> None:
    """Run a persister until SQL has each of ``order_ids``."""
    persister, _ = build_worker(WorkerKind.PERSISTER, api.runtime, asyncio.Event())
    async with asyncio.timeout(30):
        for order_id in order_ids:
            while await api.runtime.ledger.order(int(order_id)) is None:
                await persister.run_once()


async def read(api: Api, item_id: int, order_id: str | int, buyer: str) -> Answer:
    path = f"/api/v1/items/{item_id}/orders/{order_id}"
    return await api.http.get(path, headers=api.as_buyer(buyer))


async def cancel(api: Api, item_id: int, order_id: str | int, buyer: str) -> Answer:
    path = f"/api/v1/items/{item_id}/orders/{order_id}/cancel"
    return await api.http.post(path, headers=api.as_buyer(buyer))


async def rebuild(api: Api, item_id: int, by: str) -> None:
    """Rebuild the item from SQL as the reconciler does (the admin's repair), or as an
    operator's `seckill recover` does."""
    if by == "operator":
        await recover_item(api.runtime.engine, api.runtime.ledger, item_id)
        return
    answer = await api.http.post(f"/api/v1/admin/items/{item_id}/repair", headers=api.as_admin)
    assert answer.status_code == 200, answer.text
    assert [r["kind"] for r in answer.json()["repairs"]] == ["redis_lost_item"]


@pytest.mark.parametrize(
    ("by", "stock_shards"), [("reconciler", 1), ("operator", 1), ("operator", 3)]
)
async def test_an_order_lost_with_redis_reads_410_once_its_item_is_rebuilt(
    bare: Api, redis: Redis, by: str, stock_shards: int
) -> None:
    api, engine = bare, bare.runtime.engine
    before_the_item = wall_clock_ms() - 1_000
    item_id = await api.create_item(total=5, limit=1, stock_shards=stock_shards)
    other = await api.create_item(total=5)
    kept = await buy(api, item_id, "alice")
    elsewhere = await buy(api, other, "carol")
    await land(api, kept, elsewhere)
    lost = await buy(api, item_id, "bob")  # answered 202, never landed
    await flush(redis)  # Redis lost its writes: bob's order is gone on both sides

    await rebuild(api, item_id, by)
    journal = await api.runtime.ledger.repairs(item_id)
    assert [(r.kind, r.subject) for r in journal] == [
        ("redis_lost" if by == "operator" else "redis_lost_item", "item")
    ]

    for reader in ("bob", "mallory"):  # its buyer is lost with it: said to whoever asks
        answer = await read(api, item_id, lost, reader)
        assert answer.status_code == 410, answer.text
        assert answer.json()["error"] == "order_lost"
        assert "buy again" in answer.json()["message"]
    cancelled = await cancel(api, item_id, lost, "bob")
    assert cancelled.status_code == 410 and cancelled.json()["error"] == "order_lost"

    # Landed before the loss: rebuilt, and read as before (by its buyer only).
    mine = await read(api, item_id, kept, "alice")
    assert mine.status_code == 200 and mine.json()["status"] == "held", mine.text
    assert (await read(api, item_id, kept, "mallory")).status_code == 404

    never = [
        OrderIds(901).next(),  # issued after the rebuild, or not at all
        OrderIds(901, clock=lambda: before_the_item).next(),  # older than the item
        int(elsewhere),  # another item's order, landed: not lost
    ]
    for order_id in never:
        for answer in (await read(api, item_id, order_id, "bob"),
                       await cancel(api, item_id, order_id, "bob")):  # fmt: skip
            assert answer.status_code == 404, (order_id, answer.text)
            assert answer.json()["error"] == "unknown_order"

    # The per-buyer limit no longer counts the lost hold: bob may buy again.
    again = await engine.reserve(
        item_id, buyer="bob", quantity=1, idempotency_key="again", order_id=OrderIds(902).next()
    )
    assert again.outcome is Outcome.RESERVED


async def test_an_unknown_order_of_an_item_never_rebuilt_is_404(bare: Api, redis: Redis) -> None:
    api = bare
    item_id = await api.create_item(total=5)
    lost = await buy(api, item_id, "bob")
    await flush(redis)  # lost, but nothing has rebuilt the item yet: nothing is known of it
    for answer in (await read(api, item_id, lost, "bob"), await cancel(api, item_id, lost, "bob")):
        assert answer.status_code == 404 and answer.json()["error"] == "unknown_order", answer.text
