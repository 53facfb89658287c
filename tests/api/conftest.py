"""A live API for tests: uvicorn on a free port, in the test's event loop, over real Redis and
SQL; an HTTP client; tokens; signed payment notices."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvicorn
from redis.asyncio import Redis

from seckill.api.app import create_app
from seckill.api.lean_http import LeanHttpProtocol
from seckill.bootstrap.keys import token_codec
from seckill.bootstrap.runtime import Runtime, open_runtime
from seckill.bootstrap.workers import WorkerKind, build_worker
from seckill.config import Settings
from seckill.domain.money import Money
from seckill.security.signatures import SIGNATURE_HEADER, sign
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role
from seckill.serve import listening_socket
from seckill.services.tickets import TicketGate
from seckill.store.ledger import Ledger
from seckill.workers.loop import run_until_stopped
from seckill.workers.persister import PersisterConfig
from tests.conftest import RedisTarget, redis_settings

# The persister's idle read blocks at most this long (the default is a second), so a test's API
# stops in a moment rather than waiting out the read.
PERSISTER = PersisterConfig(block_ms=50)
JWT_SECRET = "test-jwt-secret-" + "x" * 32
PAYMENT_SECRET = "test-payment-secret-" + "y" * 32


def api_settings(*, database_url: str, data_dir: Path, **more: Any) -> Settings:
    """Settings for a test API; ``more`` names the Redis (see ``redis_settings``) and the rest."""
    return Settings(
        database_url=database_url,
        data_dir=data_dir,
        jwt_secret=JWT_SECRET,
        payment_secret=PAYMENT_SECRET,
        redis_max_connections=64,
        **more,
    )


@dataclass(frozen=True)
class Answer:
    status_code: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Http:
    """A small client over aiohttp that returns answers already read."""

    session: aiohttp.ClientSession
    base_url: str

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
    ) -> Answer:
        async with self.session.request(
            method, self.base_url + path, headers=headers, json=json, data=content
        ) as response:
            body = await response.read()
            return Answer(response.status, body, dict(response.headers))

    async def get(self, path: str, *, headers: Mapping[str, str] | None = None) -> Answer:
        return await self.request("GET", path, headers=headers)

    async def post(
        self,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
    ) -> Answer:
        return await self.request("POST", path, headers=headers, json=json, content=content)


@dataclass
class Api:
    """A running API and what a test needs to talk to it."""

    http: Http
    runtime: Runtime
    settings: Settings
    # (item, buyer) -> (ticket, expiry in epoch seconds), reused by buy() until it expires.
    tickets: dict[tuple[int, str], tuple[str, float]] = field(default_factory=dict)
    prices: dict[int, Money] = field(default_factory=dict)  # of the items create_item made

    def token(self, subject: str, role: Role = Role.BUYER) -> str:
        return token_codec(self.settings).mint(subject, role, ttl_seconds=600)

    def as_buyer(self, buyer: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(buyer)}"}

    @property
    def as_admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token('ops', Role.ADMIN)}"}

    async def create_item(
        self,
        *,
        total: int,
        limit: int = 1,
        hold_seconds: int = 60,
        warm: bool = True,
        starts_in: timedelta = timedelta(minutes=-1),
        ends_in: timedelta = timedelta(hours=1),
        stock_shards: int = 1,
        **fields: Any,
    ) -> int:
        """An item created and warmed through the admin routes; its sale window is relative to
        now (open from a minute ago for an hour unless told otherwise). ``fields``: more of the
        item's (its waiting room)."""
        now = datetime.now(UTC)
        answer = await self.http.post(
            "/api/v1/admin/items",
            headers=self.as_admin,
            json={
                "name": "Test phone",
                "price_cents": 19_900,
                "total": total,
                "starts_at": (now + starts_in).isoformat(),
                "ends_at": (now + ends_in).isoformat(),
                "per_buyer_limit": limit,
                "hold_seconds": hold_seconds,
                "stock_shards": stock_shards,
                **fields,
            },
        )
        assert answer.status_code == 201, answer.text
        item_id = int(answer.json()["item_id"])
        self.prices[item_id] = Money(answer.json()["price_cents"], answer.json()["currency"])
        if warm:
            warmed = await self.http.post(
                f"/api/v1/admin/items/{item_id}/warm", headers=self.as_admin
            )
            assert warmed.status_code == 200, warmed.text
        return item_id

    async def issue_ticket(self, item_id: int, buyer: str) -> Answer:
        """Ask for a new purchase ticket; the answer as it came."""
        return await self.http.post(
            f"/api/v1/items/{item_id}/tickets", headers=self.as_buyer(buyer)
        )

    async def ticket(self, item_id: int, buyer: str) -> str:
        """A valid ticket for (item, buyer): the cached one, or a new one if it is (nearly)
        expired. Fails the test if none is issued."""
        found = await self._ticket(item_id, buyer)
        assert isinstance(found, str), found.text
        return found

    async def _ticket(self, item_id: int, buyer: str) -> str | Answer:
        cached = self.tickets.get((item_id, buyer))
        if cached is None or time.time() > cached[1] - 0.5:
            issued = await self.issue_ticket(item_id, buyer)
            if issued.status_code != 200:
                return issued
            body = issued.json()
            expires = datetime.fromisoformat(body["expires_at"]).timestamp()
            cached = self.tickets[(item_id, buyer)] = (body["ticket"], expires)
        return cached[0]

    async def buy(self, item_id: int, buyer: str, key: str, quantity: int = 1) -> Answer:
        """Buy as a client does: with a ticket (see ``ticket``). When no ticket is issued, that
        refusal is the answer."""
        ticket = await self._ticket(item_id, buyer)
        if isinstance(ticket, Answer):
            return ticket
        return await self.http.post(
            f"/api/v1/items/{item_id}/orders",
            headers={**self.as_buyer(buyer), "Idempotency-Key": key, TICKET_HEADER: ticket},
            json={"quantity": quantity},
        )

    def signed(
        self, notice: dict[str, str | int], *, secret: str = PAYMENT_SECRET, at: float | None = None
    ) -> tuple[bytes, dict[str, str]]:
        body = json.dumps(notice).encode()
        return body, self.signed_headers(body, secret=secret, at=at)

    def signed_headers(
        self, body: bytes, *, secret: str = PAYMENT_SECRET, at: float | None = None
    ) -> dict[str, str]:
        """The headers a provider sends with ``body``, exactly these bytes, signed."""
        timestamp = int(time.time() if at is None else at)
        return {
            SIGNATURE_HEADER: sign(secret, body, timestamp=timestamp),
            "Content-Type": "application/json",
        }

    async def pay(
        self,
        item_id: int,
        order_id: str,
        payment_id: str,
        *,
        succeeded: bool = True,
        charged: Money | None = None,
    ) -> Answer:
        """The provider's notice; ``charged`` defaults to one unit of the item at its price."""
        if charged is None and item_id not in self.prices:  # an item made another way
            seen = await self.http.get(f"/api/v1/items/{item_id}")
            if seen.status_code == 200:
                self.prices[item_id] = Money(seen.json()["price_cents"], seen.json()["currency"])
        charged = charged or self.prices.get(item_id, Money(19_900, "USD"))
        notice: dict[str, str | int] = {
            "payment_id": payment_id,
            "item_id": item_id,
            "order_id": order_id,
            "status": "succeeded" if succeeded else "failed",
            "amount": charged.cents,
            "currency": charged.currency,
        }
        body, headers = self.signed(notice)
        return await self.http.post("/api/v1/payments/callback", content=body, headers=headers)


@contextlib.asynccontextmanager
async def running_api(
    settings: Settings,
    *,
    workers: tuple[WorkerKind, ...] = (),
    ticket_gate: TicketGate | None = None,
) -> AsyncIterator[Api]:
    """The API (and optionally workers) on one runtime, served on a free port until exit."""
    async with open_runtime(settings) as runtime:
        sock = listening_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings, runtime=runtime, ticket_gate=ticket_gate),
                http=LeanHttpProtocol,  # as `seckill serve` and `seckill api` serve it
                log_level="warning",
                access_log=False,
                # The client shares this loop: a crowd of thousands can hold a request between
                # taking a pooled connection and writing to it for seconds, and a connection the
                # server closed meanwhile answers the write with a reset. Kept well past the
                # client's own 2 s, the server never closes one the client may still take.
                timeout_keep_alive=60,
            )
        )
        stop = asyncio.Event()
        tasks = [asyncio.create_task(server.serve(sockets=[sock]))]
        for kind in workers:
            worker, pause = build_worker(kind, runtime, stop, persister=PERSISTER)
            tasks.append(asyncio.create_task(run_until_stopped(worker, stop, idle_pause=pause)))
        # The socket already listens: requests queue until uvicorn has started.
        # Idle connections are dropped long before the server's keep-alive closes them.
        connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=2)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            try:
                yield Api(Http(session, f"http://127.0.0.1:{port}"), runtime, settings)
            finally:
                stop.set()
                server.should_exit = True
                await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def waiting_room_api(
    redis_server: RedisTarget, sql_url: str, data_dir: Path, **pace: Any
) -> AsyncIterator[Api]:
    """The API with a waiting room and a quick inlet (a step every 50 ms, answers at most 50 ms
    old), and its persister; ``pace`` sets the queue_admit_* settings."""
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=data_dir,
        waiting_room=True,
        queue_inlet_interval_seconds=0.05,
        queue_front_seconds=0.05,
        **pace,
    )
    async with running_api(settings, workers=(WorkerKind.INLET, WorkerKind.PERSISTER)) as live:
        yield live


@pytest.fixture
async def api(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """A live API and its persister (a payment notice is answered once SQL holds it), on the
    session's Redis (flushed) and SQL database (emptied)."""
    settings = api_settings(**redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path)
    async with running_api(settings, workers=(WorkerKind.PERSISTER,)) as live:
        yield live


@pytest.fixture
async def api_alone(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """A live API without workers: SQL holds only what the test writes (no notice is answered:
    none lands)."""
    settings = api_settings(**redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path)
    async with running_api(settings) as live:
        yield live


@contextlib.asynccontextmanager
async def served_api(redis_server: RedisTarget, sql_url: str, data_dir: Path) -> AsyncIterator[Api]:
    """The API with its persister and a reaper passing every 50 ms, as `seckill serve` runs."""
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=data_dir,
        reaper_interval_seconds=0.05,
        ticket_ttl_seconds=600,  # a crowd's tickets outlast the whole scripted sale
    )
    async with running_api(settings, workers=(WorkerKind.PERSISTER, WorkerKind.REAPER)) as live:
        yield live


@pytest.fixture
async def served(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """``served_api`` on the session's Redis (flushed) and SQL database (emptied)."""
    async with served_api(redis_server, sql_url, tmp_path) as live:
        yield live
