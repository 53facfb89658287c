"""A bridge in a process of its own, for tests that kill it: ``python -m
tests.support.bridge_process REDIS_URL DATABASE_URL BROKER_URL TOPOLOGY_JSON`` forwards every
item stream of that Redis that the database has landed to the broker (on the test's own
exchange and queue, or stream and subjects) until SIGTERM or SIGKILL."""

from __future__ import annotations

import asyncio
import json
import sys

from seckill.engine.cluster import connect
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.sinks import sink_from_url
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.workers.bridge import Bridge, BridgeConfig
from seckill.workers.loop import run_until_stopped, stop_on_signals


async def main(
    redis_url: str, database_url: str, broker_url: str, topology: dict[str, str]
) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    redis = connect(redis_url, cluster=False, max_connections=8)
    database = open_database(database_url)
    sink = sink_from_url(broker_url, **topology)
    config = BridgeConfig(block_ms=50, poll_ms=10, claim_idle_ms=500, batch_size=50)
    bridge = Bridge(
        redis=redis,
        ledger=Ledger(database),
        sink=sink,
        consumer="test-bridge",
        config=config,
        stop=stop,
        prefix=DEFAULT_PREFIX,
    )
    try:
        await run_until_stopped(bridge, stop)
    finally:
        await sink.close()
        await redis.aclose()
        await database.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
