"""The payment provider's notices: signed, checked in constant time, applied once each."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from seckill.api.bodies import body_schema, content_type_of, parse_body
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.schemas import PaymentNoticeIn, PaymentOut
from seckill.bootstrap.services import Context
from seckill.domain.money import Money
from seckill.security.signatures import SIGNATURE_HEADER, verify_signature

router = APIRouter(prefix="/api/v1/payments", tags=["payments"])
Ctx = Annotated[Context, Depends(context)]


@router.post(
    "/callback",
    response_model=PaymentOut,
    responses=documented(401, 404, 413, 415, 422, 503),
    openapi_extra={
        "parameters": [
            {
                "name": SIGNATURE_HEADER,
                "in": "header",
                "required": True,
                "description": "t=<unix seconds>,v1=<hex HMAC-SHA256 of '<t>.<body>'>",
                "schema": {"type": "string"},
            }
        ],
        **body_schema(PaymentNoticeIn),
    },
)
async def payment_callback(request: Request, ctx: Ctx) -> PaymentOut:
    """A payment succeeded or failed. A payment id names one payment of the item: one charge
    (``amount`` in ``currency``), applied once, to one order. A success of the order's sum
    (price_cents x quantity, in the item's currency) moves the hold to paid; failure releases
    it. A success that pays nothing is a refund owed of the sum charged: ``refund_required``,
    with the reason (another sum or currency: the order is left as it was; the hold already
    released: stock never comes back; the order already paid by another payment; no such order
    under the item). A failure for an unknown order is 404.

    Answered only once the database holds what the answer says (the provider acts on it and
    never sends it again); until then 503 ``not_durable``, and the retry gets the same answer."""
    body = await request.body()  # the signature covers the exact bytes: check before parsing
    verify_signature(
        ctx.payment_secret,
        body,
        request.headers.get(SIGNATURE_HEADER),
        now=time.time(),
        tolerance_seconds=ctx.payment_tolerance_seconds,
    )
    notice = parse_body(PaymentNoticeIn, body, content_type_of(request.headers))
    settlement, view = await ctx.orders.settle_payment(
        notice.item_id,
        int(notice.order_id),
        payment_id=notice.payment_id,
        succeeded=notice.status == "succeeded",
        charged=Money(notice.amount, notice.currency),
    )
    return PaymentOut.model_validate(
        {
            "payment_id": notice.payment_id,
            "item_id": notice.item_id,
            "order_id": notice.order_id,
            "outcome": settlement.outcome.value,
            "order_status": view.status if view else None,
            "refund_required": settlement.refund_owed,
            "refund_reason": settlement.reason if settlement.refund_owed else None,
            "replayed": settlement.replayed,
        }
    )
