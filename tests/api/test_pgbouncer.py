"""seckill through PgBouncer in transaction pooling, as deployed (deploy/k8s/base/pgbouncer.ini):
a sale's orders land and its payments are answered, a lock wait still ends as 503
database_busy within the request's deadline, and a URL that does not say it goes through the
pooler is refused by it. Each test starts its own PgBouncer on a free port (its files in a
temporary directory), in front of the session's PostgreSQL database; its server pool is small,
so many client connections share few server connections."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from benchmarks.pooler import NoPgBouncer, PgBouncer, binary, pooled_url
from seckill.bootstrap.workers import WorkerKind
from seckill.store.database import is_busy, open_database, through_transaction_pooler
from seckill.store.ledger import Ledger
from seckill.store.tables import Item, Order
from tests.api.conftest import api_settings, running_api
from tests.conftest import SERVER_URLS, RedisTarget, redis_settings

single_redis = pytest.mark.redis_variants("redis7")
SERVER_POOL = 3  # server connections PgBouncer may open: fewer than the clients here

try:
    binary()
    NO_PGBOUNCER = ""
except NoPgBouncer as exc:
    NO_PGBOUNCER = str(exc)

POSTGRES = (
    "postgresql"
    if SERVER_URLS["postgresql"]
    else pytest.param("postgresql", marks=pytest.mark.skip(reason="set SECKILL_TEST_POSTGRES_URL"))
)
pytestmark = [
    pytest.mark.parametrize("sql_url", [POSTGRES], indirect=True),
    pytest.mark.skipif(bool(NO_PGBOUNCER), reason=NO_PGBOUNCER),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def bouncer(sql_url: str) -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own in front of the session's PostgreSQL."""
    server = make_url(sql_url)
    directory = Path(tempfile.mkdtemp(prefix="seckill-pgbouncer-"))
    pgbouncer = PgBouncer(
        directory, host="127.0.0.1", port=free_port(),
        server_host=server.host or "127.0.0.1", server_port=server.port or 5432,
        server_user=server.username or "postgres",
        overrides={"default_pool_size": str(SERVER_POOL), "max_db_connections": str(SERVER_POOL)},
    )  # fmt: skip
    pgbouncer.start()
    try:
        yield pgbouncer
    finally:
        pgbouncer.stop()


def through(bouncer: PgBouncer, sql_url: str) -> str:
    return pooled_url(sql_url, host=bouncer.host, port=bouncer.port)


def transactions(bouncer: PgBouncer, sql_url: str) -> int:
    """Transactions PgBouncer has carried to the test's database."""
    database = make_url(sql_url).database
    rows = bouncer.admin("SHOW STATS")
    return sum(int(row["total_xact_count"]) for row in rows if row["database"] == database)


@single_redis
async def test_a_sale_through_pgbouncer_lands_every_order_and_answers_every_payment(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path,
    bouncer: PgBouncer,
) -> None:  # fmt: skip
    url = through(bouncer, sql_url)
    assert through_transaction_pooler(url)
    settings = api_settings(**redis_settings(redis_server), database_url=url, data_dir=tmp_path)
    async with running_api(settings, workers=(WorkerKind.PERSISTER,)) as api:
        item_id = await api.create_item(total=20)
        buyers = [f"buyer-{n}" for n in range(30)]
        answers = await asyncio.gather(
            *(api.buy(item_id, buyer, key=f"k-{buyer}") for buyer in buyers)
        )
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [202] * 20 + [409] * 10, [a.text for a in answers]
        orders = [a.json()["order_id"] for a in answers if a.status_code == 202]
        paid = await asyncio.gather(*(api.pay(item_id, order, f"pay-{order}") for order in orders))
        assert [(p.status_code, p.json().get("outcome")) for p in paid] == [(200, "paid")] * 20, [
            p.text for p in paid
        ]
    # Read at the server itself, not through the pooler.
    async with ledger.engine.connect() as conn:
        landed = dict((await conn.execute(
            select(Order.status, func.count()).where(Order.item_id == item_id)
            .group_by(Order.status)
        )).all())  # fmt: skip
    assert landed == {"paid": 20}, landed
    # No server connection keeps a prepared statement another client could collide with.
    pooled = open_database(url)
    try:
        for _ in range(SERVER_POOL * 2):
            async with pooled.begin() as conn:
                kept = (await conn.execute(text("SELECT name FROM pg_prepared_statements"))).all()
                assert kept == [], kept
    finally:
        await pooled.dispose()
    # Every SQL statement went through PgBouncer, over at most SERVER_POOL server connections.
    assert transactions(bouncer, sql_url) >= 40
    servers = [r for r in bouncer.admin("SHOW SERVERS") if r["database"] == ledger_name(sql_url)]
    assert len(servers) <= SERVER_POOL, servers


def ledger_name(sql_url: str) -> str:
    name = make_url(sql_url).database
    assert name
    return name


@single_redis
async def test_a_row_locked_through_pgbouncer_is_503_database_busy_within_the_deadline(
    redis_server: RedisTarget, ledger: Ledger, sql_url: str, tmp_path: Path, bouncer: PgBouncer
) -> None:
    """Another transaction holds the item's row: ending its sale through PgBouncer waits for the
    lock, which the server gives up on (the lock_timeout set in the transaction) before the
    request's deadline, as busy (503 database_busy); freed, the sale ends."""
    deadline_s = 1.5
    settings = api_settings(
        **redis_settings(redis_server), database_url=through(bouncer, sql_url),
        data_dir=tmp_path, sql_request_timeout_seconds=deadline_s,
    )  # fmt: skip
    async with running_api(settings) as api:
        item_id = await api.create_item(total=5)
        async with ledger.engine.connect() as holder:  # at the server, beside the pooler
            await holder.execute(select(Item).where(Item.id == item_id).with_for_update())
            started = time.monotonic()
            ended = await api.http.post(f"/api/v1/admin/items/{item_id}/end", headers=api.as_admin)
            waited = time.monotonic() - started
            assert (ended.status_code, ended.json()["error"]) == (503, "database_busy"), ended.text
            assert waited < deadline_s, waited
            await holder.rollback()
        ended = await api.http.post(f"/api/v1/admin/items/{item_id}/end", headers=api.as_admin)
        assert ended.status_code == 200, ended.text


async def test_the_request_engine_through_pgbouncer_waits_for_a_lock_as_set_then_is_busy(
    ledger: Ledger, sql_url: str, bouncer: PgBouncer
) -> None:
    """The store's own answer: through the pooler, each transaction of the request engine runs
    under lock_timeout = 75% of its deadline, and a lock held past it is ``is_busy``."""
    engine = open_database(through(bouncer, sql_url), deadline_s=1.0)
    try:
        async with engine.begin() as conn:
            assert (await conn.execute(text("SHOW lock_timeout"))).scalar() == "750ms"
        async with ledger.engine.connect() as holder:
            await holder.execute(text("LOCK TABLE items IN ACCESS EXCLUSIVE MODE"))
            started = time.monotonic()
            with pytest.raises(DBAPIError, match="lock timeout") as raised:
                async with engine.begin() as conn:
                    await conn.execute(select(Item.id))
            assert is_busy(raised.value), raised.value
            assert 0.7 <= time.monotonic() - started < 1.0
            await holder.rollback()
        # The setting lasted one transaction: the server connection keeps none of it.
        async with ledger.engine.connect() as direct:
            assert (await direct.execute(text("SHOW lock_timeout"))).scalar() == "0"
    finally:
        await engine.dispose()


async def test_a_url_that_does_not_say_it_is_pooled_is_refused_by_pgbouncer(
    sql_url: str, bouncer: PgBouncer
) -> None:
    """Without ``prepared_statement_cache_size=0`` the request engine sends lock_timeout at
    connection start, which PgBouncer refuses: the parameter is what makes it work."""
    url = through(bouncer, sql_url).split("?")[0]
    assert not through_transaction_pooler(url)
    engine = open_database(url, deadline_s=1.0)
    try:
        with pytest.raises(Exception, match="unsupported startup parameter: lock_timeout"):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        with contextlib.suppress(Exception):
            await engine.dispose()
