"""An operator runs `seckill reconcile` (tables or JSON, exit code 1 on drift), repairs with
--repair, and rebuilds a lost item with `seckill recover`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis.asyncio import Redis

from seckill.domain.ids import OrderIds
from seckill.engine.engine import RedisEngine
from seckill.services.items import warm_item
from seckill.store.ledger import Ledger
from tests.conftest import RedisTarget, flush, new_item, pay, redis_settings
from tests.support.sales import Sale, drain
from tests.support.seckill_cli import seckill


@pytest.mark.redis_variants("redis7", "cluster")
async def test_reconcile_reports_repairs_and_recover_rebuilds(
    redis_server: RedisTarget,
    redis: Redis,
    engine: RedisEngine,
    ledger: Ledger,
    sql_url: str,
    tmp_path: Path,
) -> None:
    item_id = await ledger.create_item(new_item(total=10, limit=2))
    await warm_item(engine, ledger, item_id)
    sale = Sale(engine, ledger, redis, item_id, OrderIds(41))
    paid = await sale.buy("alice", 2)
    assert paid is not None and await sale.buy("bob")
    await pay(engine, item_id, paid)
    await drain(sale)
    run = dict(**redis_settings(redis_server), sql_url=sql_url, data_dir=tmp_path)

    healthy = seckill("reconcile", "--json", **run)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    [report] = json.loads(healthy.stdout)
    assert report["item_id"] == item_id and report["drift"] is False
    assert report["redis"] == report["sql"] == {"total": 10, "available": 7, "held": 1, "sold": 2}

    await redis.hincrby(engine.keys(item_id).item, "held", 4)
    found = seckill("reconcile", str(item_id), **run)
    assert found.returncode == 1
    assert "redis_counters" in found.stdout and "drift" in found.stdout

    repaired = seckill("reconcile", "--repair", "--json", str(item_id), **run)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    [report] = json.loads(repaired.stdout)
    assert [r["kind"] for r in report["repairs"]] == ["redis_counters"]
    assert report["left"] == []

    await flush(redis)
    refused = seckill("item", "warm", str(item_id), **run)
    assert refused.returncode == 2 and "seckill recover" in refused.stdout
    recovered = seckill("recover", str(item_id), **run)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert (
        "2 holds restored" in recovered.stdout and "available 7, held 1, sold 2" in recovered.stdout
    )
    again = seckill("reconcile", str(item_id), **run)
    assert again.returncode == 0, again.stdout

    # Lost whole again: the reconciler finds it and rebuilds it by itself (nothing to merge).
    await flush(redis)
    lost = seckill("reconcile", "--json", str(item_id), **run)
    assert lost.returncode == 0, lost.stdout + lost.stderr
    [report] = json.loads(lost.stdout)
    assert [r["kind"] for r in report["repairs"]] == ["redis_lost_item"] and report["left"] == []
    stock = await engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held, stock.sold) == (7, 1, 2)
    # Each rebuild journaled, the operator's as the reconciler's (a lost order is told from it).
    journal = [r.kind for r in await ledger.repairs(item_id)]
    assert journal == ["redis_counters", "redis_lost", "redis_lost_item"]
    unknown = seckill("recover", "999999", **run)
    assert unknown.returncode == 2 and "not in the database" in unknown.stdout
