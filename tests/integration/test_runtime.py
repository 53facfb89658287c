"""The embedded Redis, the bootstrap and the worker-id leases, on real servers."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
import redis as sync_redis
from redis.asyncio import Redis

from seckill.bootstrap.runtime import open_runtime
from seckill.config import Settings
from seckill.domain.configuration import ConfigurationError
from seckill.domain.ids import MAX_WORKER_ID, WorkerIdLost
from seckill.domain.outcomes import Outcome
from seckill.engine.keys import DEFAULT_PREFIX, worker_id_key
from seckill.engine.scripts import Scripts
from seckill.engine.worker_ids import NoFreeWorkerId, WorkerIdLease
from seckill.redis_server import RedisServer, RedisServerError, bundled_redis_server, server_version
from seckill.store.database import open_database
from seckill.store.migrate import upgrade
from tests.conftest import RedisTarget, client_of, open_item, redis_settings
from tests.support.brokers import free_port

on_a_cluster_too = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")


def test_the_bundled_server_is_redis_6_2() -> None:
    assert server_version(bundled_redis_server())[:2] == (6, 2)


def test_one_data_dir_one_server(tmp_path: Path) -> None:
    with RedisServer(data_dir=tmp_path) as first:
        assert sync_redis.Redis.from_url(first.url).ping()
        with pytest.raises(RedisServerError, match="in use by another embedded Redis"):
            RedisServer(data_dir=tmp_path).start()
    with RedisServer(data_dir=tmp_path):  # free again once stopped
        pass


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    with pytest.raises(RedisServerError, match="exited at start"):
        RedisServer(binary="/bin/false", data_dir=tmp_path).start()


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    server = RedisServer(data_dir=tmp_path).start()
    process = server.process
    assert process is not None
    server.stop()
    assert process.poll() is not None
    assert server.process is None


async def test_the_embedded_default_keeps_its_state_across_restarts(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, redis_url="")
    async with open_runtime(settings) as runtime:
        assert runtime.embedded_redis is not None
        await runtime.engine.load_item(open_item(total=5))
        reservation = await runtime.engine.reserve(
            1, buyer="a", quantity=1, idempotency_key="k", order_id=runtime.order_ids.next()
        )
        assert reservation.accepted
    async with open_runtime(settings) as runtime:
        stock = await runtime.engine.stock(1)
        assert stock is not None and (stock.available, stock.held) == (4, 1)
        again = await runtime.engine.reserve(
            1, buyer="a", quantity=1, idempotency_key="k", order_id=runtime.order_ids.next()
        )
        assert again.replayed and again.order_id == reservation.order_id


@on_a_cluster_too
async def test_a_configured_redis_url_starts_nothing(
    redis_server: RedisTarget, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, **redis_settings(redis_server), worker_id=9)
    async with open_runtime(settings) as runtime:
        assert runtime.embedded_redis is None
        assert runtime.order_ids.worker_id == 9
        assert await runtime.engine.load_item(open_item(item_id=77)) is Outcome.LOADED
    assert not (tmp_path / "redis").exists()


async def test_a_database_with_an_older_schema_stops_the_start_and_one_away_does_not(
    redis_server: RedisTarget, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Any process (the API, a worker, a command) refuses a database that answers with no
    schema or an older one, takes a newer one, and starts when it does not answer: a sale goes
    on through an SQL outage, its schema checked by the next process that starts."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}"
    settings = Settings(data_dir=tmp_path, **redis_settings(redis_server), database_url=url)
    with pytest.raises(ConfigurationError, match="has no schema: run `seckill db upgrade`"):
        async with open_runtime(settings):
            pass
    database = open_database(url)
    try:
        await upgrade(database, "0005")
        with pytest.raises(ConfigurationError, match="at revision 0005, older than"):
            async with open_runtime(settings):
                pass
        await upgrade(database)
    finally:
        await database.dispose()
    async with open_runtime(settings) as runtime:
        assert await runtime.ledger.items() == []
    # A later release migrated first: its revision, unknown here, serves.
    with contextlib.closing(sqlite3.connect(tmp_path / "shop.db")) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
        db.commit()
    async with open_runtime(settings) as runtime:
        assert await runtime.ledger.items() == []

    away = settings.model_copy(
        update={"database_url": f"postgresql+asyncpg://seckill@127.0.0.1:{free_port()}/shop"}
    )
    with caplog.at_level("WARNING", logger="seckill.bootstrap.runtime"):
        async with open_runtime(away) as runtime:
            assert await runtime.engine.load_item(open_item(item_id=78)) is Outcome.LOADED
    assert "the database did not answer at start" in caplog.text


@on_a_cluster_too
async def test_live_processes_never_share_a_worker_id(redis: Redis, scripts: Scripts) -> None:
    leases = [WorkerIdLease(redis, scripts=scripts, prefix="t", ttl_ms=60_000) for _ in range(50)]
    for lease in leases:
        await lease.acquire()
    assert len({lease.worker_id for lease in leases}) == 50
    dropped = leases[0].worker_id
    await leases[0].drop()
    assert not await redis.exists(worker_id_key(dropped, "t"))  # type: ignore[arg-type]


async def test_all_worker_ids_taken_is_a_clear_error(redis: Redis, scripts: Scripts) -> None:
    for n in range(MAX_WORKER_ID + 1):
        await redis.set(worker_id_key(n, "t"), "someone", px=60_000)
    with pytest.raises(NoFreeWorkerId):
        await WorkerIdLease(redis, scripts=scripts, prefix="t", ttl_ms=60_000).acquire()


@on_a_cluster_too
async def test_a_lease_taken_over_stops_its_ids(redis: Redis, scripts: Scripts) -> None:
    lease = WorkerIdLease(redis, scripts=scripts, prefix="t", ttl_ms=3_000)
    ids = await lease.acquire()
    assert await lease.renew(ids)
    ids.next()
    assert lease.worker_id is not None
    await redis.set(worker_id_key(lease.worker_id, "t"), "another process")
    assert not await lease.renew(ids)
    # The generator runs out at the end of the last renewal's safe window, then refuses.
    ids.extend(time.monotonic() - 0.001)
    with pytest.raises(WorkerIdLost):
        ids.next()
    # Our drop must not delete the lease of the process that took it over.
    await lease.drop()
    assert await redis.get(worker_id_key(ids.worker_id, "t")) == "another process"


@on_a_cluster_too
async def test_the_lease_is_kept_alive_in_the_background(
    redis_server: RedisTarget, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, **redis_settings(redis_server), worker_id_lease_seconds=3
    )
    async with open_runtime(settings) as runtime:
        await asyncio.sleep(3.5)  # longer than the lease: only renewals keep it
        assert runtime.order_ids.next() > 0
        key = worker_id_key(runtime.order_ids.worker_id, DEFAULT_PREFIX)
        assert await runtime.redis.exists(key)
    async with client_of(redis_server) as client:
        assert not await client.exists(key)  # dropped on exit
