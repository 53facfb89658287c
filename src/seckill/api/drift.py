"""An item's drift over HTTP, for the operator's console: look at what Redis and SQL disagree on,
and repair it, as ``seckill reconcile [--repair]`` does (the same reconciler, journaled)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from seckill.api.auth import AdminIdentity
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.paths import ItemId
from seckill.api.schemas import DriftOut, FindingOut, RepairOut, counters_out
from seckill.bootstrap.services import Context, reconciler
from seckill.services.items import require_item
from seckill.services.reconcile.drift import Finding
from seckill.services.reconcile.reconciler import ItemReport

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])
Ctx = Annotated[Context, Depends(context)]


@router.get(
    "/items/{item_id}/drift",
    response_model=DriftOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def drift(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> DriftOut:
    """What Redis and SQL disagree on for this item, as of one stream position. Only a look:
    nothing is fenced or repaired (the reconciler's own passes do that)."""
    await require_item(ctx.runtime.engine, ctx.ledger, item_id)
    return _drift_out(await reconciler(ctx.runtime, ledger=ctx.ledger).look(item_id))


@router.post(
    "/items/{item_id}/repair",
    response_model=DriftOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def repair(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> DriftOut:
    """Repair the drift found, each repair journaled as the reconciler's are (which side wins
    is the reconciler's rule), then look again: ``left`` is what still disagrees."""
    await require_item(ctx.runtime.engine, ctx.ledger, item_id)
    found = await reconciler(ctx.runtime, ledger=ctx.ledger).reconcile(item_id, repair=True)
    return _drift_out(found)


def _drift_out(report: ItemReport) -> DriftOut:
    return DriftOut(
        item_id=report.item_id, position=report.position, agree=not report.left,
        redis=counters_out(report.redis_stock), sql=counters_out(report.sql_stock),
        found=[_finding_out(f) for f in report.found],
        repairs=[RepairOut(kind=r.kind, subject=r.subject, action=r.action, detail=r.detail)
                 for r in report.repairs],
        left=[_finding_out(f) for f in report.left],
    )  # fmt: skip


def _finding_out(finding: Finding) -> FindingOut:
    return FindingOut(
        kind=finding.kind, subject=finding.subject, redis=finding.redis, sql=finding.sql,
        detail=finding.detail, shard=finding.shard,
    )  # fmt: skip
