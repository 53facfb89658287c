"""Two naive flash-sale strategies decided in SQL: yardsticks for ``compare.py``, not product code.

The articles seckill grew from start with these, and the benchmark measures seckill against
them. Each is written to be correct and as fast as its idea allows, so that the comparison is
with the strategy and not with a careless copy of it:

* ``rowlock`` (pessimistic): one transaction takes the item's row with ``SELECT ... FOR
  UPDATE``; if enough stock is left it decrements it and inserts the order, then commits. Every
  purchase of the item, refused or not, queues on that one row lock.
* ``conditional`` (optimistic): one transaction runs ``UPDATE ... SET stock = stock - q WHERE
  item_id = ? AND stock >= q``; one row changed means the units are ours, and the order is
  inserted in the same transaction. A refusal changes no row, but InnoDB still locks the row
  to test ``stock >= q``, and under concurrency refusals queue on that lock much as they do on
  ``FOR UPDATE`` (the row-lock waits ``compare.py`` prints show it).

Both keep the product's promises where SQL can. Each transaction first looks the idempotency key
up (a plain read, no lock): a repeated key answers the first order (202, same order id), also
after the item sold out, and an order is unique per (item, buyer, key). The per-buyer limit is
checked inside the deciding transaction while it holds the item's row lock (every accepted
purchase of an item serialises there, so the check sees every order committed before it).
Lock-wait timeouts and deadlocks are retried a bounded number of times, then answered 503.
There is no hold deadline, payment or release here: an order is ``held`` for good, which is all
the comparison needs. Neither reads the stock ahead to refuse without the lock once it is gone:
that would be a third strategy (a sold-out flag, as seckill keeps one in each API process).

They are served like seckill: a FastAPI app on uvicorn on uvloop, one process, the same bearer
tokens (``seckill.security.tokens.token_codec``), the same request and response bodies, error
shape, body limit and admission limit. Only the purchase route and ``/healthz`` exist.

    python benchmarks/baselines.py --strategy rowlock --database-url URL --port 8001

serves one until SIGTERM or SIGINT, with the token secret and the rest from ``SECKILL_*``
variables. Its tables are made by ``create_schema`` and ``add_item`` (``compare.py`` does that
on a fresh database before it starts the server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

import uvicorn
import uvloop
from fastapi import Body, Depends, FastAPI, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from starlette.types import ASGIApp, Receive, Scope, Send

from seckill.api.admission import RETRY_AFTER, Admission
from seckill.api.errors import ApiError, documented, install_error_handlers
from seckill.api.limits import BodySizeLimit
from seckill.api.paths import PURCHASE_ROUTE, ItemId, is_purchase
from seckill.api.responses import send_json
from seckill.api.schemas import BuyIn, ReservationOut
from seckill.bootstrap.keys import token_codec
from seckill.config import Settings
from seckill.domain.rules import MAX_BUYER_LEN, MAX_KEY_LEN, check_idempotency_key
from seckill.observability import metrics
from seckill.security.tokens import InvalidToken, Role
from seckill.serve import listening_socket

# MariaDB/MySQL: lock wait timeout, deadlock victim. Anything else is not retried.
RETRIED_ERRORS = {1205, 1213}
ATTEMPTS = 5  # tries per purchase before 503
LOCK_WAIT_TIMEOUT_S = 10  # per session; the server default (50 s) would only hide a stall
HOLD = timedelta(hours=1)  # only echoed as pay_before: nothing here expires


class Strategy(StrEnum):
    ROWLOCK = "rowlock"
    CONDITIONAL = "conditional"


metadata = MetaData()

# No CHECK (stock >= 0) on purpose: a strategy that oversold must show it in the audit rather
# than have the database hide it as an error.
items = Table(
    "items",
    metadata,
    Column("item_id", BigInteger, primary_key=True, autoincrement=False),
    Column("total", BigInteger, nullable=False),
    Column("stock", BigInteger, nullable=False),
    Column("per_buyer_limit", Integer, nullable=False),
)

orders = Table(
    "orders",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("item_id", BigInteger, nullable=False),
    # Visible ASCII only (the product's rule), so one byte per character in the unique key.
    Column("buyer", String(MAX_BUYER_LEN, collation="ascii_bin"), nullable=False),
    Column("idempotency_key", String(MAX_KEY_LEN, collation="ascii_bin"), nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("deadline_at", DateTime(timezone=False), nullable=False),
    Column("created_at", DateTime(timezone=False), nullable=False),
    # Also the index the buyer check reads by (item, buyer).
    UniqueConstraint("item_id", "buyer", "idempotency_key", name="uq_orders_item_buyer_key"),
    mysql_engine="InnoDB",
)

# Before deciding: does the item exist, its limit, and did this key buy already? One round trip,
# no lock: a repeat is answered without queueing for the item.
_LOOKUP = text(
    "SELECT i.per_buyer_limit, o.id, o.quantity, o.deadline_at FROM items i "
    "LEFT JOIN orders o ON o.item_id = i.item_id AND o.buyer = :buyer "
    "AND o.idempotency_key = :key WHERE i.item_id = :item"
)
_LOCK_ITEM = text("SELECT stock FROM items WHERE item_id = :item FOR UPDATE")
_TAKE_STOCK = text("UPDATE items SET stock = stock - :q WHERE item_id = :item")
_TAKE_STOCK_IF_ENOUGH = text(
    "UPDATE items SET stock = stock - :q WHERE item_id = :item AND stock >= :q"
)
# Read under the item's row lock: the buyer's orders, to find the key and add up the units.
_BUYERS_ORDERS = text(
    "SELECT id, idempotency_key, quantity, deadline_at FROM orders "
    "WHERE item_id = :item AND buyer = :buyer"
)
_INSERT_ORDER = text(
    "INSERT INTO orders (item_id, buyer, idempotency_key, quantity, status, deadline_at, "
    "created_at) VALUES (:item, :buyer, :key, :q, 'held', :deadline, :now)"
)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a purchase came to: an order (new or replayed), or the refusal's code."""

    refusal: str | None = None
    order_id: int | None = None
    quantity: int = 0
    deadline: datetime | None = None


SOLD_OUT = Decision(refusal="sold_out")
INSUFFICIENT = Decision(refusal="insufficient_stock")
LIMIT_REACHED = Decision(refusal="limit_reached")
UNKNOWN_ITEM = Decision(refusal="unknown_item")
KEY_REUSED = Decision(refusal="key_reused")

REFUSALS = {
    "sold_out": (409, "sold out"),
    "insufficient_stock": (409, "fewer units left than asked for"),
    "limit_reached": (409, "this buyer has reached the per-buyer limit"),
    "unknown_item": (404, "no such item on sale"),
    "key_reused": (422, "this idempotency key was used with another request body"),
}


class Busy(Exception):
    """Still deadlocked or waiting for a lock after every attempt."""


class SqlStore:
    """One strategy over one connection pool."""

    def __init__(self, engine: AsyncEngine, strategy: Strategy) -> None:
        self.engine = engine
        self.strategy = strategy
        self.retries = 0
        self.gave_up = 0

    async def buy(self, item_id: int, *, buyer: str, key: str, quantity: int) -> Decision:
        for attempt in range(ATTEMPTS):
            try:
                async with self.engine.connect() as conn:
                    return await self._decide(conn, item_id, buyer, key, quantity)
            except IntegrityError:
                # The unique (item, buyer, key) as a last guard: the buyer check under the lock
                # sees any order of this key already. Should it refuse the insert anyway, the
                # next attempt finds the order and replays it.
                continue
            except DBAPIError as exc:
                if _mysql_code(exc) not in RETRIED_ERRORS:
                    raise
                self.retries += 1
                # Jittered, so the victims of one deadlock do not collide again at once.
                await asyncio.sleep(random.uniform(0.001, 0.005) * (attempt + 1))
        self.gave_up += 1
        raise Busy

    async def _decide(
        self, conn: AsyncConnection, item_id: int, buyer: str, key: str, q: int
    ) -> Decision:
        # One transaction (READ COMMITTED: each statement sees what committed before it).
        async with conn.begin() as transaction:
            params = {"item": item_id, "buyer": buyer, "key": key, "q": q}
            found = (await conn.execute(_LOOKUP, params)).first()
            if found is None:
                return UNKNOWN_ITEM
            if found.id is not None:
                return _replayed(found, q)
            if self.strategy is Strategy.ROWLOCK:
                stock = (await conn.execute(_LOCK_ITEM, params)).scalar_one()
                if stock < q:
                    await transaction.rollback()  # releases the lock
                    return SOLD_OUT if stock <= 0 else INSUFFICIENT
            else:
                taken = await conn.execute(_TAKE_STOCK_IF_ENOUGH, params)
                if taken.rowcount != 1:
                    await transaction.rollback()
                    return SOLD_OUT
            # Every accepted purchase of the item holds its row lock from here to the commit,
            # so the buyer's orders read now are all there are.
            mine = (await conn.execute(_BUYERS_ORDERS, params)).all()
            same_key = next((row for row in mine if row.idempotency_key == key), None)
            if same_key is not None or sum(row.quantity for row in mine) + q > found[0]:
                await transaction.rollback()  # the units go back (conditional)
                return LIMIT_REACHED if same_key is None else _replayed(same_key, q)
            if self.strategy is Strategy.ROWLOCK:
                await conn.execute(_TAKE_STOCK, params)
            now = datetime.now(UTC).replace(tzinfo=None)
            deadline = now + HOLD
            inserted = await conn.execute(
                _INSERT_ORDER, params | {"deadline": deadline, "now": now}
            )
            return Decision(order_id=inserted.lastrowid, quantity=q, deadline=deadline)


def _replayed(order: Any, q: int) -> Decision:
    """The order recorded under the key, answered again; another quantity is a misuse."""
    if order.quantity != q:
        return KEY_REUSED
    return Decision(order_id=order.id, quantity=order.quantity, deadline=order.deadline_at)


def _mysql_code(exc: DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def open_pool(database_url: str, *, pool_size: int) -> AsyncEngine:
    """Up to ``pool_size`` connections, no overflow (the warm-up opens them before the clock)."""
    return create_async_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=30,
        pool_recycle=3600,
        # READ COMMITTED, as the product's own SQL engine: each statement sees what committed
        # before it (the buyer check under the lock must), and inserts take no gap locks.
        isolation_level="READ COMMITTED",
        connect_args={
            "connect_timeout": 10,
            "init_command": f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}",
        },
    )


async def create_schema(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
    finally:
        await engine.dispose()


async def add_item(database_url: str, *, item_id: int, total: int, per_buyer_limit: int) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                items.insert().values(
                    item_id=item_id, total=total, stock=total, per_buyer_limit=per_buyer_limit
                )
            )
    finally:
        await engine.dispose()


# auto_error off: a missing token gets the product's error body (401), as in seckill.api.auth.
_bearer = HTTPBearer(auto_error=False)


# async although it does no I/O: FastAPI runs a plain `def` dependency in its thread pool, a hop
# per request that would be the stack's cost, not the strategy's.
async def _buyer(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None:
        raise InvalidToken("a bearer token is required")
    identity = request.app.state.tokens.verify(credentials.credentials)
    if identity.role is not Role.BUYER:
        raise ApiError(403, "forbidden", "this route is for buyers")
    return str(identity.subject)


BuyerId = Annotated[str, Depends(_buyer)]


def create_baseline_app(
    strategy: Strategy, database_url: str, settings: Settings, *, pool_size: int = 64
) -> FastAPI:
    """The purchase route of ``strategy``, with seckill's tokens, bodies and errors."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = open_pool(database_url, pool_size=pool_size)
        app.state.store = SqlStore(engine, strategy)
        try:
            yield
        finally:
            await engine.dispose()

    app = FastAPI(title=f"baseline: {strategy.value}", lifespan=lifespan)
    app.state.tokens = token_codec(settings)
    install_error_handlers(app)

    @app.post(
        PURCHASE_ROUTE,
        status_code=202,
        response_model=ReservationOut,
        responses=documented(400, 401, 403, 404, 409, 413, 422, 503),
    )
    async def buy(
        request: Request,
        item_id: ItemId,
        buyer: BuyerId,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        body: Annotated[BuyIn | None, Body()] = None,
    ) -> ReservationOut:
        if idempotency_key is None:
            raise ApiError(400, "idempotency_key_required", "send an Idempotency-Key header")
        key = idempotency_key.strip()
        if len(key) >= 2 and key[0] == key[-1] == '"':
            key = key[1:-1]
        check_idempotency_key(key)
        quantity = body.quantity if body else 1
        store: SqlStore = request.app.state.store
        try:
            decision = await store.buy(item_id, buyer=buyer, key=key, quantity=quantity)
        except Busy:
            raise ApiError(
                503, "database_busy", "still waiting for a lock after retries",
                {"Retry-After": "1"},
            ) from None  # fmt: skip
        if decision.refusal is not None:
            status, message = REFUSALS[decision.refusal]
            raise ApiError(status, decision.refusal, message)
        assert decision.order_id is not None and decision.deadline is not None
        return ReservationOut(
            order_id=str(decision.order_id),
            item_id=item_id,
            quantity=decision.quantity,
            status="held",
            pay_before=decision.deadline.replace(tzinfo=UTC),
        )

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        store: SqlStore = request.app.state.store
        async with store.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return {"database": "ok", "retries": store.retries, "gave_up": store.gave_up}

    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(AdmissionLimit, max_in_flight=settings.admission_max_in_flight)
    return app


async def serve(strategy: Strategy, database_url: str, *, host: str, port: int, pool: int) -> None:
    """As ``seckill serve`` serves its API: our own listening socket, uvicorn, until a signal."""
    sock = listening_socket(host, port)
    app = create_baseline_app(strategy, database_url, Settings(), pool_size=pool)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", type=Strategy, choices=list(Strategy), required=True)
    parser.add_argument("--database-url", required=True, help="SQLAlchemy async URL (asyncmy)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pool-size", type=int, default=64, help="SQL connections")
    args = parser.parse_args(argv)
    uvloop.run(
        serve(args.strategy, args.database_url, host=args.host, port=args.port,
              pool=args.pool_size)
    )  # fmt: skip


class AdmissionLimit:
    """ASGI middleware: purchase requests beyond the limit get 503 ``overloaded`` at once, as
    seckill's purchase route sheds them (it admits by itself, without a middleware)."""

    def __init__(self, app: ASGIApp, *, max_in_flight: int) -> None:
        self.app = app
        self.admission = Admission(max_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_purchase(scope):
            await self.app(scope, receive, send)
            return
        if not self.admission.try_enter():
            metrics.SHED.inc()
            await send_json(send, 503, self.admission.refusal, [RETRY_AFTER])
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave()


if __name__ == "__main__":
    main()
