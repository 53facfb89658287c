"""Faults and bad input: Redis away means 503 and nothing accepted; SQL away means buying goes
on and lands later while admin writes answer 503; bad input is a clear 4xx, never a 500."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.engine import make_url

from benchmarks.tcp_proxy import TcpProxy
from seckill.bootstrap.workers import WorkerKind
from seckill.domain.rules import MAX_KEY_LEN
from seckill.redis_server import RedisServer
from seckill.security.tickets import TICKET_HEADER
from seckill.store.ledger import Ledger
from seckill.store.tables import Item
from tests.api.conftest import Api, api_settings, running_api
from tests.conftest import SERVER_BACKENDS, RedisTarget, redis_settings
from tests.support.polling import wait_until

single_redis = pytest.mark.redis_variants("redis7")
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server this test may kill and restart (from its AOF)."""
    binary = shutil.which("redis-server")
    assert binary
    server = RedisServer(binary=binary, data_dir=tmp_path / "redis", appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@sqlite_only
async def test_redis_down_means_503_and_nothing_accepted(
    own_redis: RedisServer, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    settings = api_settings(
        redis_url=own_redis.url, database_url=sql_url, data_dir=tmp_path,
        fence_check_seconds=0.05,
    )  # fmt: skip
    async with running_api(settings, workers=(WorkerKind.RECONCILER,)) as api:
        item_id = await api.create_item(total=10)
        assert (await api.buy(item_id, "alice", "k1")).status_code == 202

        own_redis.kill()
        for n in range(5):
            answer = await api.buy(item_id, f"buyer-{n}", f"k-{n}")
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "redis_unavailable"
            assert answer.headers["Retry-After"]
        health = await api.http.get("/healthz")
        assert (health.status_code, health.json()) == (
            503,
            {"redis": "unavailable", "database": "ok"},
        )

        own_redis.start()  # same AOF: the sale is where it was

        async def buying_again() -> bool:
            # Restarted, the item is fenced until the reconciler has checked it against SQL.
            answer = await api.buy(item_id, "bob", "k-bob")
            assert answer.status_code in (202, 503), answer.text
            return answer.status_code == 202

        await wait_until(buying_again, 10, "buying after Redis came back")
        stock = await api.runtime.engine.stock(item_id)
        # alice and bob only: none of the refused requests took stock.
        assert stock is not None and (stock.available, stock.held) == (8, 2)


@single_redis
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS, indirect=True)
async def test_sql_down_buying_goes_on_admin_writes_503_and_the_backlog_lands(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    url = make_url(sql_url)
    assert url.host
    proxy = TcpProxy(url.host, url.port or (5432 if "postgresql" in sql_url else 3306))
    await proxy.start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = api_settings(**redis_settings(redis_server), database_url=proxied, data_dir=tmp_path)
    try:
        async with running_api(settings, workers=(WorkerKind.PERSISTER,)) as api:
            item_id = await api.create_item(total=50)
            proxy.cut()
            bought = await asyncio.gather(*(api.buy(item_id, f"b{n}", "k") for n in range(20)))
            assert {a.status_code for a in bought} == {202}
            create = await api.http.post(
                "/api/v1/admin/items",
                headers=api.as_admin,
                json={
                    "name": "x", "price_cents": 1, "total": 1,
                    "starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z",
                },
            )  # fmt: skip
            assert create.status_code == 503, create.text
            assert create.json()["error"] == "database_unavailable"
            health = await api.http.get("/healthz")
            assert health.json() == {"redis": "ok", "database": "unavailable"}

            proxy.restore()

            async def landed() -> bool:
                answer = await api.http.get(f"/api/v1/admin/items/{item_id}", headers=api.as_admin)
                body = answer.json()
                return answer.status_code == 200 and body["agree"] and body["backlog"] == 0

            await wait_until(landed, 60, "the backlog landed after the outage")
            orders = await api.runtime.ledger.orders(item_id)
            assert len(orders) == 20
    finally:
        proxy.restore()
        await proxy.stop()


@single_redis
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS, indirect=True)
async def test_sql_black_holed_admin_routes_answer_503_never_hang(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    """SQL accepts connections and answers nothing (a host gone off the network, no reset):
    every route that needs it answers 503 database_unavailable while it is still black-holed,
    and buying goes on."""
    url = make_url(sql_url)
    assert url.host
    proxy = TcpProxy(url.host, url.port or (5432 if "postgresql" in sql_url else 3306))
    await proxy.start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = api_settings(
        **redis_settings(redis_server), database_url=proxied, data_dir=tmp_path,
        sql_request_timeout_seconds=1.0,
    )  # fmt: skip
    try:
        async with running_api(settings) as api:
            item_id = await api.create_item(total=5)
            bought = await api.buy(item_id, "alice", "k")
            assert bought.status_code == 202
            proxy.black_hole()
            for path in (
                f"/api/v1/admin/items/{item_id}",
                f"/api/v1/admin/items/{item_id}/audit",
                "/api/v1/admin/refunds",
                "/api/v1/admin/items",
            ):
                answer = await api.http.get(path, headers=api.as_admin)
                assert (answer.status_code, answer.json()["error"]) == (
                    503, "database_unavailable"
                ), (path, answer.text)  # fmt: skip
            assert (await api.buy(item_id, "bob", "k")).status_code == 202
            assert not proxy._relaying.is_set()  # answered while SQL still said nothing
    finally:
        proxy.restore()
        await proxy.stop()


NEW_ITEM = {
    "name": "x", "price_cents": 1, "total": 1,
    "starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z",
}  # fmt: skip


@single_redis
async def test_item_creations_at_once_on_the_embedded_sqlite_all_succeed_while_busy(
    redis_server: RedisTarget, tmp_path: Path
) -> None:
    """16 item creations at once on the default database, while the API's loop is busy (each
    turn blocked 10 ms, as under load): every one is created. SQLite's writers used to wait for
    its one lock in its busy handler, where the last ones passed the request's deadline (503).
    The deadline is short here so that this happened on every run, not on some."""
    settings = api_settings(
        **redis_settings(redis_server), database_url="", data_dir=tmp_path,
        sql_request_timeout_seconds=0.5,
    )  # fmt: skip

    async def busy_loop() -> None:
        while True:
            await asyncio.sleep(0)
            time.sleep(0.01)  # noqa: ASYNC251 - the point: a loop kept busy

    async with running_api(settings) as api:
        busy = asyncio.create_task(busy_loop())
        try:
            for _ in range(3):  # the first burst also opens the pool's connections
                created = await asyncio.gather(
                    *(api.http.post("/api/v1/admin/items", headers=api.as_admin, json=NEW_ITEM)
                      for _ in range(16))
                )  # fmt: skip
                assert [a.status_code for a in created] == [201] * 16, [a.text for a in created]
        finally:
            busy.cancel()
        assert len(await api.runtime.ledger.items_on_sale(datetime.now(UTC))) == 48


@single_redis
@sqlite_only
async def test_sql_busy_past_the_deadline_is_503_database_busy(
    redis_server: RedisTarget, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    """Another process holds SQLite's write lock past the request's deadline: the database is
    busy, not unreachable (503 database_busy, come back in a second); freed, it writes again."""
    settings = api_settings(
        **redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path,
        sql_request_timeout_seconds=0.5,
    )  # fmt: skip
    database = make_url(sql_url).database
    assert database
    async with running_api(settings) as api:
        holder = sqlite3.connect(database, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the one writer's lock, held
            create = await api.http.post("/api/v1/admin/items", headers=api.as_admin, json=NEW_ITEM)
            assert (create.status_code, create.json()["error"]) == (503, "database_busy")
            assert create.headers["Retry-After"] == "1"
        finally:
            holder.rollback()
            holder.close()
        create = await api.http.post("/api/v1/admin/items", headers=api.as_admin, json=NEW_ITEM)
        assert create.status_code == 201, create.text


@single_redis
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS, indirect=True)
async def test_a_row_locked_past_the_deadline_is_503_database_busy(
    redis_server: RedisTarget, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    """Another transaction holds the item's row: ending its sale waits for the lock, which the
    server gives up on before the request's deadline, as busy (503 database_busy), never as
    unreachable; freed, the sale ends."""
    settings = api_settings(
        **redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path,
        sql_request_timeout_seconds=1.5,
    )  # fmt: skip
    async with running_api(settings) as api:
        item_id = await api.create_item(total=5)
        async with ledger.engine.connect() as holder:
            await holder.execute(select(Item).where(Item.id == item_id).with_for_update())
            ended = await api.http.post(f"/api/v1/admin/items/{item_id}/end", headers=api.as_admin)
            assert (ended.status_code, ended.json()["error"]) == (503, "database_busy"), ended.text
            assert ended.headers["Retry-After"] == "1"
            await holder.rollback()
        ended = await api.http.post(f"/api/v1/admin/items/{item_id}/end", headers=api.as_admin)
        assert ended.status_code == 200, ended.text


@single_redis
@sqlite_only
@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"quantity": "three"}', "invalid_request"),
        (b'{"quantity": 0}', "invalid_request"),
        (b'{"quantity": 1.5}', "invalid_request"),
        (b'{"quantity": 99999999999999999999999}', "invalid_request"),
        (b'{"quantity": null}', "invalid_request"),
        (b'{"quantity": 1, "price": 0}', "invalid_request"),
        (b"[1, 2]", "invalid_request"),
        (b"{not json", "invalid_request"),
        (b'{"quantity": 2}', "quantity_above_limit"),
    ],
)
async def test_bad_purchase_bodies_are_422_and_change_nothing(
    api: Api, body: bytes, error: str
) -> None:
    item_id = await api.create_item(total=5)
    answer = await api.http.post(
        f"/api/v1/items/{item_id}/orders",
        headers={
            **api.as_buyer("alice"),
            "Idempotency-Key": "k",
            "Content-Type": "application/json",
            TICKET_HEADER: await api.ticket(item_id, "alice"),
        },
        content=body,
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == error
    assert answer.json()["message"]
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.available == 5


@single_redis
@sqlite_only
async def test_bad_ids_keys_and_sizes(api: Api) -> None:
    item_id = await api.create_item(total=5)
    buyer = api.as_buyer("alice")
    too_big = await api.http.post(
        f"/api/v1/items/{item_id}/orders",
        headers={**buyer, "Idempotency-Key": "k", "Content-Type": "application/json"},
        content=b'{"quantity": 1, "pad": "' + b"x" * 20_000 + b'"}',
    )
    assert too_big.status_code == 413
    assert too_big.json()["error"] == "body_too_large"
    for path in ("/api/v1/items/abc", "/api/v1/items/0", "/api/v1/items/99999999999999999999"):
        answer = await api.http.get(path)
        assert answer.status_code == 422, (path, answer.text)
    assert (await api.http.get("/api/v1/items/424242")).status_code == 404
    for order_id in ("abc", "0", "-1", "99999999999999999999"):
        answer = await api.http.get(f"/api/v1/items/{item_id}/orders/{order_id}", headers=buyer)
        assert answer.status_code == 422, (order_id, answer.text)
    long_key = await api.buy(item_id, "alice", "k" * (MAX_KEY_LEN + 1))
    assert long_key.status_code == 422
    assert long_key.json()["error"] == "invalid_key"
    not_ascii = await api.http.post(
        f"/api/v1/items/{item_id}/orders",
        headers={
            **buyer,
            "Idempotency-Key": "ключ",
            TICKET_HEADER: await api.ticket(item_id, "alice"),
        },
    )
    assert not_ascii.status_code in {400, 422}
    unknown = await api.buy(424242, "alice", "k")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_item")
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.available == 5
