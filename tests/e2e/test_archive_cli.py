"""An operator lists items with their stages and archives a settled one with `seckill item
archive` (refused, exit 1, with the reason, while its sale is on)."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from seckill.engine.engine import RedisEngine
from seckill.store.ledger import Ledger
from tests.conftest import RedisTarget, redis_settings
from tests.integration.test_archive import keys_of, new_sale, settled_sale
from tests.support.seckill_cli import seckill


async def test_item_list_and_archive(
    redis_server: RedisTarget,
    redis: Redis,
    engine: RedisEngine,
    ledger: Ledger,
    sql_url: str,
    tmp_path: Path,
) -> None:
    settled = await settled_sale(redis, engine, ledger)
    on_sale = await new_sale(engine, ledger, lasts_s=600)
    run = dict(**redis_settings(redis_server), sql_url=sql_url, data_dir=tmp_path)

    listed = seckill("item", "list", **run)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "settled" in listed.stdout and "on_sale" in listed.stdout

    refused = seckill("item", "archive", str(on_sale), **run)
    assert refused.returncode == 1
    assert "not archived" in refused.stdout and "not_ended" in refused.stdout
    done = seckill("item", "archive", str(settled), **run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"item {settled} archived" in done.stdout
    assert await keys_of(redis, settled) == []
    assert "archived" in seckill("item", "list", **run).stdout
    unknown = seckill("item", "archive", "999999", **run)
    assert unknown.returncode == 2 and "no item 999999" in unknown.stdout
