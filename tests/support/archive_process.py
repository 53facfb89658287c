"""Archiving in a process of its own, for tests that kill it: ``python -m
tests.support.archive_process REDIS_URL DATABASE_URL ITEM_ID...`` archives each item (its grace
waived), printing "ready" first and "done" at the end."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from seckill.engine.cluster import connect
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.services.archive import Archivist
from seckill.store.database import open_database
from seckill.store.ledger import Ledger


async def main(redis_url: str, database_url: str, item_ids: list[int]) -> None:
    redis = connect(redis_url, cluster=False, max_connections=8)
    database = open_database(database_url)
    scripts = Scripts(redis)
    await scripts.load()
    engine = RedisEngine(
        redis, scripts=scripts, idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX
    )
    archivist = Archivist(engine=engine, ledger=Ledger(database), grace=timedelta(0))
    print("ready", flush=True)
    for item_id in item_ids:
        await archivist.archive(item_id, waive_grace=True)
    print("done", flush=True)
    await redis.aclose()
    await database.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3:]]))
