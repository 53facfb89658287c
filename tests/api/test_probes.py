"""The probes tell the truth: /livez while the process serves, /readyz while it can sell. SQL
away leaves it ready (and buying goes on), Redis away or a lapsed worker id makes it unready;
each store's state is in the body and in ``seckill_dependency_up``."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from benchmarks.tcp_proxy import TcpProxy
from seckill.redis_server import RedisServer
from seckill.store.ledger import Ledger
from tests.api.conftest import Api, api_settings, running_api
from tests.api.test_metrics import parse, value
from tests.conftest import SERVER_BACKENDS, RedisTarget, redis_settings

single_redis = pytest.mark.redis_variants("redis7")
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

ALL_UP = {"ready": True, "redis": "ok", "worker_id_lease": "held", "draining": False}


async def dependency_up(api: Api) -> dict[str, float]:
    samples = parse((await api.http.get("/metrics")).text)
    return {
        name: value(samples, "seckill_dependency_up", dependency=name)
        for name in ("redis", "database")
    }


@single_redis
@sqlite_only
async def test_live_and_ready_with_everything_up_unready_once_the_worker_id_lapses(
    api: Api,
) -> None:
    live = await api.http.get("/livez")
    assert (live.status_code, live.json()) == (200, {"status": "alive"})
    # Served as the lean routes are, with their layers.
    assert "x-request-id" in {name.lower() for name in live.headers}
    ready = await api.http.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {**ALL_UP, "database": "ok"})
    assert await dependency_up(api) == {"redis": 1, "database": 1}

    # A lease not renewed in time: this process would issue no order id, so it takes none.
    ids = api.runtime.order_ids
    ids.extend(time.monotonic() - 1)
    try:
        ready = await api.http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() | {"worker_id_lease": "lapsed", "ready": False} == ready.json()
        assert (await api.http.get("/livez")).status_code == 200
    finally:
        ids.extend(float("inf"))  # until its keeper renews it


@single_redis
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS[:1], indirect=True)  # one is enough
async def test_sql_down_leaves_the_process_ready_and_buying(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    url = make_url(sql_url)
    assert url.host
    proxy = TcpProxy(url.host, url.port or (5432 if "postgresql" in sql_url else 3306))
    await proxy.start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = api_settings(**redis_settings(redis_server), database_url=proxied, data_dir=tmp_path)
    try:
        async with running_api(settings) as api:
            item_id = await api.create_item(total=5)
            proxy.cut()
            ready = await api.http.get("/readyz")
            assert (ready.status_code, ready.json()) == (200, {**ALL_UP, "database": "unavailable"})
            assert await dependency_up(api) == {"redis": 1, "database": 0}
            assert (await api.buy(item_id, "alice", "k")).status_code == 202
            health = await api.http.get("/healthz")  # the combined view, not a probe
            assert (health.status_code, health.json()["database"]) == (503, "unavailable")
    finally:
        proxy.restore()
        await proxy.stop()


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server this test may kill."""
    binary = shutil.which("redis-server")
    assert binary
    server = RedisServer(binary=binary, data_dir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@sqlite_only
async def test_redis_down_makes_the_process_unready_not_dead(
    own_redis: RedisServer, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    settings = api_settings(redis_url=own_redis.url, database_url=sql_url, data_dir=tmp_path)
    async with running_api(settings) as api:
        assert (await api.http.get("/readyz")).status_code == 200
        own_redis.kill()
        ready = await api.http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {
            "ready": False, "redis": "unavailable", "worker_id_lease": "held",
            "draining": False, "database": "ok",
        }  # fmt: skip
        assert (await dependency_up(api))["redis"] == 0
        assert (await api.http.get("/livez")).status_code == 200
