"""Refunds owed, for the operator who gives the money back: list them (paged, by item and
state) and mark each refunded once done."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from seckill.api.auth import AdminIdentity
from seckill.api.bodies import body_schema, strict_body
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.paging import DEFAULT_LIMIT, Cursor, Limit, decode_cursor, id_cursor, id_position
from seckill.api.paths import ItemId
from seckill.api.schemas import RefundedIn, RefundOut, RefundPageOut
from seckill.bootstrap.services import Context
from seckill.domain.money import RefundState
from seckill.domain.rules import MAX_ID
from seckill.services.refunds import list_refunds, mark_refunded
from seckill.store.records import RefundRecord

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])
Ctx = Annotated[Context, Depends(context)]


@router.get("/refunds", response_model=RefundPageOut, responses=documented(401, 403, 422, 503))
async def refunds(
    _: AdminIdentity,
    ctx: Ctx,
    item_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="One item's only.")] = None,
    state: Annotated[RefundState | None, Query(description="owed or refunded.")] = None,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
) -> RefundPageOut:
    """Refunds owed for successful charges that paid nothing (the order released first, or
    paid by another payment), newest first, a page at a time."""
    before = decode_cursor(cursor, id_position)
    page = await list_refunds(ctx.ledger, item_id=item_id, state=state, cursor=before, limit=limit)
    return RefundPageOut(
        refunds=[refund_out(r) for r in page.refunds], next_cursor=id_cursor(page.next_cursor)
    )


@router.post(
    "/items/{item_id}/refunds/{payment_id:path}/refunded",
    response_model=RefundOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def refunded(item_id: ItemId, payment_id: str, _: AdminIdentity, ctx: Ctx) -> RefundOut:
    """The money of this payment's refund was given back. Idempotent: marking it again keeps
    the first time. 404 ``unknown_refund`` when no refund is owed for that payment. A payment
    id of ``.`` or ``..`` cannot travel in a browser's path: ``POST /refunds/refunded`` takes
    any in its body."""
    return refund_out(await mark_refunded(ctx.ledger, item_id, payment_id))


@router.post(
    "/refunds/refunded",
    response_model=RefundOut,
    responses=documented(401, 403, 404, 413, 415, 422, 503),
    openapi_extra=body_schema(RefundedIn),
)
async def refunded_by_body(
    _: AdminIdentity, body: Annotated[RefundedIn, Depends(strict_body(RefundedIn))], ctx: Ctx
) -> RefundOut:
    """The money of this payment's refund was given back: the payment named in the body, as
    it is, whatever it holds (``.``, ``..``, ``/``, ``%``, ``?``). Idempotent: marking it again
    keeps the first time. 404 ``unknown_refund`` when no refund is owed for that payment."""
    return refund_out(await mark_refunded(ctx.ledger, body.item_id, body.payment_id))


def refund_out(refund: RefundRecord) -> RefundOut:
    return RefundOut.model_validate(
        {
            "item_id": refund.item_id, "payment_id": refund.payment_id,
            "order_id": str(refund.order_id), "buyer": refund.buyer,
            "quantity": refund.quantity, "amount_cents": refund.amount_cents,
            "currency": refund.currency, "reason": refund.reason, "state": refund.state,
            "owed_at": refund.owed_at,
            "refunded_at": refund.refunded_at,
        }
    )  # fmt: skip
