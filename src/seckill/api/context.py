"""The routes' dependency on their Context (``bootstrap/services.py``), built once per app."""

from __future__ import annotations

from fastapi import Request

from seckill.bootstrap.services import Context


# Dependencies are async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool,
# a hop per dependency per request that cost the purchase route about a third of its rate.
async def context(request: Request) -> Context:
    ctx: Context = request.app.state.context
    return ctx
