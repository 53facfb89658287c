"""Operator routes: create an item in SQL, warm it into Redis, compare the two records, see
each item's stage and archive it once settled."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from seckill.api.auth import AdminIdentity
from seckill.api.bodies import body_schema, strict_body
from seckill.api.buyers import item_out
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.paging import DEFAULT_LIMIT, Cursor, Limit, decode_cursor, id_cursor, id_position
from seckill.api.paths import ItemId
from seckill.api.schemas import (
    AdmissionOut,
    ArchiveOut,
    AuditOut,
    CheckOut,
    HindranceOut,
    ItemCountersOut,
    ItemOut,
    ItemStageOut,
    ItemStagePageOut,
    NewItemIn,
    QueueReportOut,
    WarmOut,
    counters_out,
)
from seckill.bootstrap.services import Context, archivist
from seckill.domain.items import ItemRecord
from seckill.domain.lifecycle import Stage, described
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.domain.times import ms_to_datetime
from seckill.services.archive import Archivist, Settlement
from seckill.services.items import create_item as create_item_service
from seckill.services.items import (
    end_sale,
    item_counters,
    item_on_sale,
    require_item,
    warm_item,
)
from seckill.services.reconcile.records import audit_records
from seckill.services.waiting_room import queue_report

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])
Ctx = Annotated[Context, Depends(context)]


@router.post(
    "/items",
    status_code=201,
    response_model=ItemOut,
    responses=documented(401, 403, 413, 415, 422, 503),
    openapi_extra=body_schema(NewItemIn),
)
async def create_item(
    _: AdminIdentity, body: Annotated[NewItemIn, Depends(strict_body(NewItemIn))], ctx: Ctx
) -> ItemOut:
    """Put an item in the record (SQL). It goes on sale once warmed."""
    item_id = await create_item_service(
        ctx.ledger, ctx.item_cache, ctx.item_defaults,
        name=body.name, price_cents=body.price_cents, currency=body.currency,
        total=body.total,
        starts_at=body.starts_at, ends_at=body.ends_at,
        per_buyer_limit=body.per_buyer_limit, hold_seconds=body.hold_seconds,
        stock_shards=body.stock_shards, waiting_room=body.waiting_room,
        queue_admit_per_second=body.queue_admit_per_second,
        queue_open_seconds=body.queue_open_seconds,
    )  # fmt: skip
    return item_out(await item_on_sale(ctx.item_cache, item_id))


@router.post(
    "/items/{item_id}/warm",
    response_model=WarmOut,
    responses=documented(401, 403, 404, 409, 422, 503),
)
async def warm(
    item_id: ItemId,
    _: AdminIdentity,
    ctx: Ctx,
    force: Annotated[
        bool, Query(description="Reload an item with holds or sales (keeps them).")
    ] = False,
) -> WarmOut:
    """Load the item as SQL records it into Redis, where it is sold, and rewrite its cached
    card (what buyers read)."""
    outcome = await warm_item(
        ctx.runtime.engine, ctx.ledger, item_id, force=force, cache=ctx.item_cache
    )
    ctx.tickets.forget(item_id)
    return WarmOut.model_validate({"item_id": item_id, "outcome": outcome.value})


@router.post(
    "/items/{item_id}/end",
    response_model=ItemOut,
    responses=documented(401, 403, 404, 409, 422, 503),
)
async def end(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> ItemOut:
    """End the item's sale now: no purchase is taken after it, nor a ticket (other API
    processes may issue one for a quarter of a second more: their purchase is refused), while
    holds taken before it may still be paid until their deadline. Ending an ended item changes
    nothing. 409 ``sale_not_started`` (the sale has not begun) or ``item_archived``."""
    await end_sale(ctx.runtime.engine, ctx.ledger, item_id, cache=ctx.item_cache)
    ctx.tickets.forget(item_id)
    return item_out(await item_on_sale(ctx.item_cache, item_id))


@router.get(
    "/items/{item_id}",
    response_model=ItemCountersOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def counters(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> ItemCountersOut:
    """The item's counters in Redis and in SQL, side by side, and the backlog between them."""
    found = await item_counters(ctx.runtime.engine, ctx.ledger, item_id)
    return ItemCountersOut(
        item_id=item_id,
        redis=counters_out(found.redis),
        sql=counters_out(found.sql),
        backlog=found.backlog,
        agree=found.redis == found.sql,
        shards=[counters_out(shard) for shard in found.shards],
    )


@router.get("/items", response_model=ItemStagePageOut, responses=documented(401, 403, 422, 503))
async def items(
    _: AdminIdentity,
    ctx: Ctx,
    stage: Annotated[Stage | None, Query(description="Items at this stage only.")] = None,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
) -> ItemStagePageOut:
    """The items, newest first, a page at a time, each with its stage (scheduled, on_sale,
    ended, settled, archived) and what keeps it from being archived."""
    page = await _archivist(ctx).page(
        stage_of=stage, before=decode_cursor(cursor, id_position), limit=limit
    )
    return ItemStagePageOut(
        items=[_stage_out(record, settled) for record, settled in page.stages],
        next_cursor=id_cursor(page.next_cursor),
    )


@router.post(
    "/items/{item_id}/archive",
    response_model=ArchiveOut,
    responses=documented(401, 403, 404, 409, 422, 503),
)
async def archive(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> ArchiveOut:
    """Archive a settled item now (its grace period waived): its keys leave Redis; SQL keeps
    it and answers every read of it. 409 ``item_unsettled``, with the reasons, while anything
    is unsettled (nothing changes then)."""
    done = await _archivist(ctx).archive(item_id, waive_grace=True)
    if done.stage is not Stage.ARCHIVED:
        why = described(done.hindrances)
        raise InvalidRequest(ErrorCode.ITEM_UNSETTLED, f"item {item_id} is {done.stage}: {why}")
    return ArchiveOut(
        item_id=item_id, stage=done.stage, removed=done.removed,
        unsettled=[HindranceOut(reason=h.reason, detail=h.detail) for h in done.hindrances],
    )  # fmt: skip


def _archivist(ctx: Context) -> Archivist:
    return archivist(ctx.runtime, ledger=ctx.ledger)


def _stage_out(record: ItemRecord, s: Settlement) -> ItemStageOut:
    return ItemStageOut(
        item_id=s.item_id, name=record.name, starts_at=record.starts_at, ends_at=record.ends_at,
        waiting_room=record.waiting_room, stage=s.stage, archived_at=s.archived_at,
        unsettled=[HindranceOut(reason=h.reason, detail=h.detail) for h in s.hindrances],
    )  # fmt: skip


@router.get(
    "/items/{item_id}/audit",
    response_model=AuditOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def audit(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> AuditOut:
    """Check the item's invariants in Redis, and Redis against SQL, from one look: stock
    balanced, buyers within their limit, every order in SQL, the same counters on both sides."""
    await require_item(ctx.runtime.engine, ctx.ledger, item_id)
    checks = await audit_records(ctx.runtime.engine, ctx.ledger, item_id)
    return AuditOut(
        item_id=item_id,
        passed=all(c.ok for c in checks),
        checks=[CheckOut(name=c.name, ok=c.ok, detail=c.detail) for c in checks],
    )


@router.get(
    "/items/{item_id}/queue",
    response_model=QueueReportOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def queue(item_id: ItemId, _: AdminIdentity, ctx: Ctx) -> QueueReportOut:
    """The item's waiting room: how many joined, how far the frontier moved, and each step the
    inlet took (when, and up to which position)."""
    report = await queue_report(ctx.queues, item_id)
    front = report.front
    return QueueReportOut(
        item_id=item_id,
        length=front.length,
        drawn=front.sealed,
        admitted_up_to=front.admitted_up_to,
        admissions_per_s=front.admissions_per_s,
        admissions=[
            AdmissionOut(at=ms_to_datetime(a.at_ms), upto=a.upto) for a in report.admissions
        ],
    )
