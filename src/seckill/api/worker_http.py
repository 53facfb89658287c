"""The metrics listener: what a process serves over HTTP beside (or instead of) the API, on
``SECKILL_METRICS_PORT``: its metrics for Prometheus, and its liveness. Nothing else, and no
token: keep the port internal (the deployment lets only the monitoring namespace reach it).

A worker (``seckill worker <kind> --metrics-port N``) serves it from ``seckill.serve``. The API
serves it from its lifespan when the port is set (``metrics_listener``), each of its processes
on the same port (SO_REUSEPORT), and then answers ``/metrics`` on the public port no more.

``/metrics`` answers ``seckill.observability.metrics.exposition``: this process's own metrics,
or with ``SECKILL_METRICS_DIR`` those of every process writing there, after ``refresh`` (the
API's stream gauges, read from Redis). ``/livez`` answers 200 while the event loop runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seckill.api.paths import LIVEZ_ROUTE
from seckill.api.schemas import LiveOut
from seckill.api.sockets import listening_socket
from seckill.observability import metrics
from seckill.workers.loop import idle_until_next_tick

log = logging.getLogger(__name__)

_ALIVE = LiveOut(status="alive").model_dump_json().encode()

Refresh = Callable[[], Awaitable[None]]


class QuietServer(uvicorn.Server):
    """uvicorn, minus its own signal handling: the process's owner (seckill.serve's stop
    event, or the API's server) keeps SIGTERM and SIGINT. Its housekeeping wakes once a second
    rather than ten times (each wake-up costs an idle process some 0.2 ms of CPU), and
    ``should_exit`` set wakes it at once."""

    _exit_asked: asyncio.Event | None = None

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._exit_asked is not None:
            self._exit_asked.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        self._exit_asked = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # on_tick counts tenths of a second (the date header each 10, other checks each).
            counter = (counter + 10) % 864_000
            await idle_until_next_tick(self._exit_asked, 1.0)  # with the workers' pauses
            should_exit = await self.on_tick(counter)


def worker_app(refresh: Refresh | None = None) -> Starlette:
    """The ASGI app of a metrics listener; ``refresh`` runs before each scrape."""

    async def scrape(request: Request) -> Response:
        if refresh is not None:
            await refresh()
        return Response(metrics.exposition(), media_type=metrics.EXPOSITION_CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", scrape), Route(LIVEZ_ROUTE, _alive)])


async def _alive(request: Request) -> Response:
    return Response(_ALIVE, media_type="application/json")


@contextlib.asynccontextmanager
async def metrics_listener(host: str, port: int, refresh: Refresh) -> AsyncIterator[None]:
    """The listener served in this event loop while the context is open. The port is shared
    with the process's siblings (SO_REUSEPORT): every process of an API answers a scrape with
    all of their metrics (SECKILL_METRICS_DIR)."""
    sock = listening_socket(host, port, backlog=128, shared=True)
    config = uvicorn.Config(
        worker_app(refresh), log_level="warning", access_log=False, lifespan="off"
    )
    server = QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    bound_host, bound_port = sock.getsockname()[:2]
    log.info("metrics on http://%s:%d/metrics", bound_host, bound_port)
    try:
        yield
    finally:
        server.should_exit = True
        await task
        sock.close()
