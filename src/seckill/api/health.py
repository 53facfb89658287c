"""The probes: ``/livez`` (the process serves), ``/readyz`` (it can sell), and ``/healthz``
(both stores, side by side).

Liveness and readiness are different questions. A process is live while it answers at all:
restarting it would not help anything else. It is ready while it can take a purchase: Redis
answers, its order-id worker id is usable, and it is not draining after SIGTERM. SQL is not
part of readiness: purchases are decided in Redis and wait in its streams while SQL is away, so
a host that took itself out of rotation over SQL would stop the sale for nothing. ``/readyz``
reports SQL all the same, as does ``seckill_dependency_up``.

``/livez`` is a lean route, answered with no I/O ahead of the framework (``LIVEZ`` in
``seckill.api.lean_routes``); the other two are the framework's.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from seckill.api.context import context
from seckill.api.drain import Drain
from seckill.api.schemas import HealthOut, ReadyOut
from seckill.bootstrap.services import Context
from seckill.observability import metrics

router = APIRouter(tags=["health"])
Ctx = Annotated[Context, Depends(context)]
_TIMEOUT_S = 2.0
# A probe's own bound: each store gets this long, both at once, so /readyz answers within about
# a second (give the probe a timeout of 2 s).
PROBE_TIMEOUT_S = 1.0

Status = Literal["ok", "unavailable"]


async def drain(request: Request) -> Drain:
    found: Drain = request.app.state.drain
    return found


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}})
async def readyz(ctx: Ctx, draining: Annotated[Drain, Depends(drain)]) -> JSONResponse:
    """Readiness, for load balancers: 200 when Redis answers a PING within 1 s, the order-id
    worker id is usable and the process is not draining after SIGTERM; else 503. SQL is
    reported (``database``) but never makes the process unready: buying goes on without it."""
    redis, database = await asyncio.gather(
        _redis(ctx, PROBE_TIMEOUT_S), _database(ctx, PROBE_TIMEOUT_S)
    )
    ids = ctx.runtime.order_ids
    lease = "lapsed" if ids.lapsed else "held" if ids.leased else "fixed"
    stopping = draining.draining
    ready = redis == "ok" and lease != "lapsed" and not stopping
    body = ReadyOut(
        ready=ready, redis=redis, worker_id_lease=lease, draining=stopping, database=database
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/healthz", response_model=HealthOut, responses={503: {"model": HealthOut}})
async def healthz(ctx: Ctx) -> JSONResponse:
    """Both stores side by side: 200 when Redis and SQL both answer within 2 s; 503 (with which
    one) otherwise. Not a probe: SQL down is 503 here while buying goes on; probe ``/livez``
    and ``/readyz``."""
    redis, database = await asyncio.gather(_redis(ctx, _TIMEOUT_S), _database(ctx, _TIMEOUT_S))
    ok = redis == database == "ok"
    return JSONResponse({"redis": redis, "database": database}, status_code=200 if ok else 503)


async def _redis(ctx: Context, bound_s: float) -> Status:
    try:
        await asyncio.wait_for(ctx.runtime.redis.ping(), bound_s)
    except Exception:
        return _seen("redis", "unavailable")
    return _seen("redis", "ok")


async def _database(ctx: Context, bound_s: float) -> Status:
    try:
        async with asyncio.timeout(bound_s), ctx.ledger.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:
        return _seen("database", "unavailable")
    return _seen("database", "ok")


def _seen(dependency: str, status: Status) -> Status:
    metrics.DEPENDENCY_UP.labels(dependency).set(1 if status == "ok" else 0)
    return status
