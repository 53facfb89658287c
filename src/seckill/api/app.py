"""The app factory: routes, error handlers, the body limit, and the runtime they share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Depends, FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from seckill import __version__
from seckill.api import (
    admin,
    buyers,
    console,
    dashboard,
    dead_letters,
    drift,
    health,
    metrics,
    payments,
    queue,
    refunds,
    tickets,
    waiting_page,
)
from seckill.api.drain import Drain
from seckill.api.errors import install_error_handlers
from seckill.api.lean_routes import LIVEZ, LeanRoutes
from seckill.api.lean_schema import with_lean_routes
from seckill.api.limits import BodySizeLimit
from seckill.api.metrics import HttpMetrics, refresh_stream_gauges_logged
from seckill.api.query_strings import query_once
from seckill.api.request_ids import RequestIds
from seckill.api.worker_http import metrics_listener
from seckill.bootstrap.keys import refreshing_keys
from seckill.bootstrap.runtime import Runtime, open_runtime, settle_heap
from seckill.bootstrap.services import build_context
from seckill.config import Settings
from seckill.security.passes import PASS_HEADER
from seckill.security.tickets import TICKET_HEADER
from seckill.services.tickets import TicketGate

# What a page on an allowed origin may send and read (every header a route takes or gives).
CORS_METHODS = ("GET", "POST")
CORS_REQUEST_HEADERS = (
    "Authorization", "Content-Type", "Idempotency-Key", TICKET_HEADER, PASS_HEADER, "X-Request-Id",
)  # fmt: skip
CORS_EXPOSED_HEADERS = ("Retry-After", "X-Request-Id")


class SeckillApi(FastAPI):
    """FastAPI, with the buyers' hot routes served ahead of its machinery (see LeanRoutes).

    CORS, when origins are allowed, wraps both ways in: one answer to a preflight, the same
    headers on a lean route's answer as on any other. Without origins it costs one test."""

    def __init__(
        self, *, lean_routes: LeanRoutes, cors_origins: Sequence[str] = (), **options: Any
    ) -> None:
        super().__init__(**options)
        self.lean_routes = lean_routes
        self._with_lean_routes: dict[str, Any] | None = None
        self.cors: ASGIApp | None = None
        if cors_origins:
            self.cors = CORSMiddleware(
                self._dispatch,
                allow_origins=list(cors_origins),
                allow_methods=list(CORS_METHODS),
                allow_headers=list(CORS_REQUEST_HEADERS),
                expose_headers=list(CORS_EXPOSED_HEADERS),
                max_age=600,
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cors is not None:
            await self.cors(scope, receive, send)
            return
        # _dispatch's lines, inline: without CORS a purchase takes no extra call.
        route = self.lean_routes.route_of(scope)
        if route is not None:
            await self.lean_routes.serve(route, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """The schema: the framework's routes' entries, and the lean routes' from their
        declarations (``seckill.api.lean_schema``)."""
        # The framework keeps the schema it is given back until its routes change.
        framework = super().openapi()
        if framework is self._with_lean_routes:
            return framework
        schema = with_lean_routes(framework, self.lean_routes.routes)
        self.openapi_schema = self._with_lean_routes = schema
        return schema

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Each request, behind CORS: a lean route's, or the framework's."""
        route = self.lean_routes.route_of(scope)
        if route is not None:
            await self.lean_routes.serve(route, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    runtime: Runtime | None = None,
    ticket_gate: TicketGate | None = None,
    drain: Drain | None = None,
) -> SeckillApi:
    """The API. With ``runtime`` it serves that one (its owner closes it); without, it opens
    its own at startup and closes it at shutdown. ``ticket_gate`` decides who may have a
    purchase ticket (a captcha, a waiting room); without one, everyone may. ``drain`` is what
    ``/readyz`` asks whether the process is draining (whoever handles SIGTERM begins it)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if runtime is None:
                active = await stack.enter_async_context(open_runtime(settings))
            else:
                active = runtime
            app.state.context = build_context(active, ticket_gate=ticket_gate)
            lean_routes.context = app.state.context
            # A key set the tokens are checked with is loaded again in the background.
            await stack.enter_async_context(refreshing_keys(app.state.context.tokens, settings))
            if settings.metrics_port is not None:  # /metrics off the public port
                engine = active.engine
                await stack.enter_async_context(
                    metrics_listener(
                        settings.metrics_host,
                        settings.metrics_port,
                        lambda: refresh_stream_gauges_logged(engine),
                    )
                )
            yield

    served_lean = (  # tried in this order: the purchase first
        buyers.BUY, tickets.ISSUE_TICKET, buyers.GET_ITEM, queue.JOIN_QUEUE, queue.QUEUE_STANDING,
        LIVEZ,
    )  # fmt: skip
    lean_routes = LeanRoutes(
        routes=served_lean,
        max_in_flight=settings.admission_max_in_flight,
        max_body_bytes=settings.max_body_bytes,
    )
    app = SeckillApi(
        lean_routes=lean_routes,
        cors_origins=settings.cors_origins,
        title="seckill",
        version=__version__,
        description="A flash-sale backend: every purchase decided by one atomic Redis script.",
        lifespan=lifespan,
        dependencies=[Depends(query_once)],
    )
    app.state.drain = drain or Drain()
    install_error_handlers(app)
    routers = (
        buyers, admin, drift, refunds, dead_letters, payments, health, dashboard, console,
        waiting_page,
    )  # fmt: skip
    for module in routers:
        app.include_router(module.router)
    app.router.routes.extend(lean_routes.paths())  # another method there: 405, as on the others
    if settings.metrics_port is None:  # else served by the metrics listener, on its own port
        app.include_router(metrics.router)
    # The other routes' layers; the lean routes do the same for themselves.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestIds)
    app.add_middleware(HttpMetrics)  # outermost, so every answer is counted and timed
    return app


def app_from_environment() -> SeckillApi:
    """The API as each process of ``seckill api --workers N`` builds it: settings from the
    environment, logging as they say, its own runtime opened at startup, and the drain its
    supervisor begins on SIGTERM (see ``seckill.api.drain``)."""
    from seckill.observability.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    app = create_app(settings, drain=Drain.from_environment())
    settle_heap()
    return app
