"""What a worker process serves over HTTP (``seckill worker <kind> --metrics-port N``): its
metrics for Prometheus, and its liveness. Nothing else, and no token: keep the port internal.

``/metrics`` answers what the API's does (``seckill.observability.metrics.exposition``): this
process's own metrics, or with ``SECKILL_METRICS_DIR`` those of every process writing there.
``/livez`` answers 200 while the process's event loop runs (no I/O). ``seckill.serve`` runs this
app on uvicorn inside the worker's own loop.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from seckill.api.paths import LIVEZ_ROUTE
from seckill.api.schemas import LiveOut
from seckill.observability import metrics

_ALIVE = LiveOut(status="alive").model_dump_json().encode()


def worker_app() -> Starlette:
    """The ASGI app of a worker's metrics listener."""
    return Starlette(routes=[Route("/metrics", _scrape), Route(LIVEZ_ROUTE, _alive)])


async def _scrape(request: Request) -> Response:
    return Response(metrics.exposition(), media_type=metrics.EXPOSITION_CONTENT_TYPE)


async def _alive(request: Request) -> Response:
    return Response(_ALIVE, media_type="application/json")
