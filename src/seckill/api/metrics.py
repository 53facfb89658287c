"""``GET /metrics`` for Prometheus, and the middleware that counts and times every request.

The route has no authentication (scrapers call it) and is left out of the OpenAPI schema: keep
it off the public network (serve it on an internal address, or block the path at the edge).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seckill.api.context import context
from seckill.api.paths import PURCHASE_PATH, PURCHASE_ROUTE
from seckill.bootstrap.services import Context
from seckill.domain.outcomes import Outcome
from seckill.engine.cluster import REDIS_FAILED
from seckill.engine.engine import RedisEngine
from seckill.engine.streams import refresh_stream_gauges
from seckill.observability import metrics

log = logging.getLogger(__name__)

router = APIRouter()
UNMATCHED = "other"
RATE_LIMITED = Outcome.RATE_LIMITED.value
_MAX_ERROR_BODY = 4096  # our error bodies are small; anything longer is not one of ours


@router.get("/metrics", include_in_schema=False)
async def scrape(ctx: Annotated[Context, Depends(context)]) -> Response:
    """Every metric in Prometheus's text format, the stream gauges read from Redis now (served
    here only without SECKILL_METRICS_PORT; with it, on that port: ``api.worker_http``)."""
    await refresh_stream_gauges_logged(ctx.runtime.engine)
    return Response(metrics.exposition(), media_type=metrics.EXPOSITION_CONTENT_TYPE)


async def refresh_stream_gauges_logged(engine: RedisEngine) -> None:
    """The stream gauges read from Redis now; if Redis fails, the rest is still worth a
    scrape (the gauges keep their last values)."""
    try:
        await refresh_stream_gauges(engine)
    except REDIS_FAILED as exc:
        log.warning("stream gauges not refreshed: %s", exc)


class HttpMetrics:
    """ASGI middleware: ``seckill_http_requests_total{route, outcome}`` and
    ``seckill_http_request_duration_seconds{route}`` for every HTTP request.

    Plain ASGI (not BaseHTTPMiddleware, which costs a task and a stream per request). The route
    is the matched route's template, read from the scope after the app ran. The one request
    answered before routing is an admission shed, always on the purchase route. The outcome of
    an error is the ``error`` code of its JSON body, the only time the body is looked at.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # if the app raises before answering
        error_body: bytearray | None = None

        async def sending(message: Message) -> None:
            nonlocal status, error_body
            if message["type"] == "http.response.start":
                status = message["status"]
                if status >= 400:
                    error_body = bytearray()
            elif error_body is not None and len(error_body) <= _MAX_ERROR_BODY:
                error_body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = _route(scope)
            record_request(route, _outcome(route, status, error_body), started)


def record_request(route: str, outcome: str, started: float) -> None:
    """Count one answered request and time it from ``started`` (``time.perf_counter()``)."""
    counter = _counters.get((route, outcome))
    if counter is None:  # first of its kind: label it once, not on every request
        counter = _counters[route, outcome] = metrics.HTTP_REQUESTS.labels(route, outcome)
    counter.inc()
    if outcome == RATE_LIMITED:
        metrics.RATE_LIMITED.inc()
    timer = _timers.get(route)
    if timer is None:
        timer = _timers[route] = metrics.HTTP_REQUEST_DURATION.labels(route)
    timer.observe(time.perf_counter() - started)


_counters: dict[tuple[str, str], Any] = {}
_timers: dict[str, Any] = {}


def _route(scope: Scope) -> str:
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    return PURCHASE_ROUTE if PURCHASE_PATH.fullmatch(scope["path"]) else UNMATCHED


def _outcome(route: str, status: int, error_body: bytearray | None) -> str:
    if status < 400:
        return "reserved" if route == PURCHASE_ROUTE and status == 202 else str(status)
    if error_body is not None and len(error_body) <= _MAX_ERROR_BODY:
        try:
            body: Any = json.loads(error_body)
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return str(body["error"])
    return str(status)
