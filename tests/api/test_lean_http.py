"""The lean routes answered on the connection (``seckill.api.lean_http``) say, byte for byte,
what the same app says through uvicorn's ASGI path: the same app served twice, on one runtime,
once by each protocol, and sent the same raw HTTP/1.1 (keep-alive, pipelining, HTTP/1.0,
chunked and oversized bodies, escapes, 100-continue)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from redis.asyncio import Redis

from seckill.api.app import SeckillApi, create_app
from seckill.api.lean_http import LeanHttpProtocol
from seckill.bootstrap.keys import token_codec
from seckill.bootstrap.runtime import open_runtime
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role
from seckill.serve import listening_socket
from seckill.store.ledger import Ledger
from tests.api.conftest import api_settings
from tests.conftest import RedisTarget, redis_settings

_DATE = re.compile(rb"\r\ndate: [^\r]*")


class Served:
    """One app on two ports: ``lean`` (LeanHttpProtocol) and ``asgi`` (uvicorn's own)."""

    def __init__(self, app: SeckillApi, lean: int, asgi: int) -> None:
        self.app, self.lean, self.asgi = app, lean, asgi
        self.asgi_calls = 0  # lean requests that reached the app through ASGI
        self.last_lean_asgi_calls = 0  # of them, in the last exchange with ``lean``

    async def exchange(self, port: int, raw: bytes, answers: int = 1) -> list[bytes]:
        """Send ``raw`` on a new connection; the ``answers`` read back (dates removed), then
        b"closed" if the server closed the connection, b"open" if it kept it."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(raw)
            await writer.drain()
            got = [await _read_answer(reader) for _ in range(answers)]
            try:
                more = await asyncio.wait_for(reader.read(1), 0.3)
            except TimeoutError:
                more = b"open"
            got.append(more or b"closed")
            return got
        finally:
            writer.close()

    async def both(self, raw: bytes, answers: int = 1) -> list[bytes]:
        """The answers of both ways, which must be the same; and the lean way took no ASGI."""
        before = self.asgi_calls
        lean = await self.exchange(self.lean, raw, answers)
        lean_asgi = self.asgi_calls - before
        asgi = await self.exchange(self.asgi, raw, answers)
        assert lean == asgi
        self.last_lean_asgi_calls = lean_asgi
        return lean


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = re.search(rb"content-length: (\d+)", head)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    return _DATE.sub(b"", head) + body


@contextlib.asynccontextmanager
async def served_twice(
    settings_dir: Path, redis_server: RedisTarget, sql_url: str
) -> AsyncIterator[Served]:
    settings = api_settings(**redis_settings(redis_server), database_url=sql_url,
                            data_dir=settings_dir, max_body_bytes=1024)  # fmt: skip
    async with open_runtime(settings) as runtime:
        app = create_app(settings, runtime=runtime)
        socks = [listening_socket("127.0.0.1", 0) for _ in range(2)]
        servers = [
            uvicorn.Server(uvicorn.Config(app, http=LeanHttpProtocol, lifespan="on",
                                          log_level="warning")),
            uvicorn.Server(uvicorn.Config(app, http="httptools", lifespan="off",
                                          log_level="warning")),
        ]  # fmt: skip
        tasks = [
            asyncio.create_task(s.serve(sockets=[k])) for s, k in zip(servers, socks, strict=True)
        ]
        while not all(server.started for server in servers):  # noqa: ASYNC110 (uvicorn's flag)
            await asyncio.sleep(0.01)
        served = Served(app, *(sock.getsockname()[1] for sock in socks))
        serve_asgi = app.lean_routes.serve

        async def counted(*args: object) -> None:
            served.asgi_calls += 1
            await serve_asgi(*args)  # type: ignore[arg-type]

        app.lean_routes.serve = counted  # type: ignore[method-assign]
        try:
            yield served
        finally:
            for server in servers:
                server.should_exit = True
            await asyncio.gather(*tasks)


@pytest.fixture
async def both_ways(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Served]:
    """The app served twice, on the session's Redis (flushed) and SQL database (emptied)."""
    async with served_twice(tmp_path, redis_server, sql_url) as live:
        yield live


def request(method: str, path: str, *lines: str, body: bytes = b"", version: str = "1.1") -> bytes:
    head = [f"{method} {path} HTTP/{version}", "host: t", "x-request-id: rid-1", *lines]
    if body and not any(line.lower().startswith("transfer-encoding") for line in lines):
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_refusals_read_the_same_and_never_go_through_asgi(both_ways: Served) -> None:
    token = token_codec(both_ways.app.state.context.runtime.settings).mint(
        "b1", Role.BUYER, ttl_seconds=60
    )
    auth = f"authorization: Bearer {token}"
    json_type = "content-type: application/json"
    cases = [
        request("GET", "/livez"),
        request("POST", "/api/v1/items/1/orders", json_type, body=b"{}"),  # no token
        request("POST", "/api/v1/items/1/orders", auth, json_type, body=b'{"quantity":"1"}'),
        request("POST", "/api/v1/items/1/orders", auth, "content-type: text/plain", body=b"{}"),
        request("POST", "/api/v1/items/1/orders", auth, json_type, body=b'{"quantity":1}'),
        request(
            "POST", "/api/v1/items/0/orders", auth, "idempotency-key: k", TICKET_HEADER + ": x"
        ),
        request("GET", "/api/v1/items/99999"),
        request("GET", "/api/v1/items/1?a=1&a=2"),
        request("POST", "/api/v1/items/1/tickets", "authorization: Bearer nope"),
    ]
    for raw in cases:
        [answer, state] = await both_ways.both(raw)
        assert state == b"open", answer
        assert both_ways.last_lean_asgi_calls == 0, raw


async def test_bodies_over_the_limit_are_refused_and_the_connection_closed(
    both_ways: Served,
) -> None:
    over = request("POST", "/api/v1/items/1/orders", body=b" " * 2000)
    [answer, state] = await both_ways.both(over)
    assert answer.startswith(b"HTTP/1.1 413") and state == b"closed"
    chunked = (
        request("POST", "/api/v1/items/1/orders", "transfer-encoding: chunked")
        + b"400\r\n" + b" " * 1024 + b"\r\n" + b"400\r\n" + b" " * 1024 + b"\r\n0\r\n\r\n"
    )  # fmt: skip
    [answer, state] = await both_ways.both(chunked)
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer
    assert state == b"closed"
    length_over = request("GET", "/livez", "content-length: 5000")
    [answer, state] = await both_ways.both(length_over)
    assert answer.startswith(b"HTTP/1.1 413") and state == b"closed"


async def test_keep_alive_pipelining_and_http_1_0(both_ways: Served) -> None:
    three = request("GET", "/livez") * 3
    answers = await both_ways.both(three, answers=3)
    assert len(answers) == 4 and answers[-1] == b"open"
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers[:3])
    [answer, state] = await both_ways.both(request("GET", "/livez", version="1.0"))
    assert b"connection: close" in answer and state == b"closed"
    [answer, _] = await both_ways.both(request("GET", "/livez", "connection: close"))
    assert b"connection: close" in answer


async def test_what_the_lean_way_leaves_to_asgi_reads_the_same(both_ways: Served) -> None:
    escaped = request("GET", "/api/v1/items/%31")
    await both_ways.both(escaped)
    assert both_ways.last_lean_asgi_calls == 1  # the framework's path: a lean route, unescaped
    expecting = request("POST", "/api/v1/items/1/orders", "expect: 100-continue", body=b"{}")
    answers = await both_ways.both(expecting, answers=2)
    assert answers[0].startswith(b"HTTP/1.1 100") and answers[1].startswith(b"HTTP/1.1 401")
