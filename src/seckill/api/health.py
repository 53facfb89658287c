"""Liveness of the two stores the API needs."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from sqlalchemy import text

from seckill.api.context import context
from seckill.api.schemas import HealthOut
from seckill.bootstrap.services import Context

router = APIRouter(tags=["health"])
Ctx = Annotated[Context, Depends(context)]
_TIMEOUT_S = 2.0

Status = Literal["ok", "unavailable"]


@router.get("/healthz", response_model=HealthOut, responses={503: {"model": HealthOut}})
async def healthz(ctx: Ctx) -> JSONResponse:
    """200 when Redis and SQL both answer within 2 s; 503 (with which one) otherwise."""
    redis, database = await asyncio.gather(_redis(ctx), _database(ctx))
    ok = redis == database == "ok"
    return JSONResponse({"redis": redis, "database": database}, status_code=200 if ok else 503)


async def _redis(ctx: Context) -> Status:
    try:
        await asyncio.wait_for(ctx.runtime.redis.ping(), _TIMEOUT_S)
    except Exception:
        return "unavailable"
    return "ok"


async def _database(ctx: Context) -> Status:
    try:
        async with asyncio.timeout(_TIMEOUT_S), ctx.ledger.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:
        return "unavailable"
    return "ok"
