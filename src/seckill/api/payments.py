"""The payment provider's notices: signed, checked in constant time, applied once each."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from seckill.api.context import Context, context
from seckill.api.errors import documented
from seckill.api.schemas import PaymentNoticeIn, PaymentOut
from seckill.domain.outcomes import Outcome
from seckill.security.signatures import SIGNATURE_HEADER, verify_signature

router = APIRouter(prefix="/api/v1/payments", tags=["payments"])
Ctx = Annotated[Context, Depends(context)]


@router.post(
    "/callback",
    response_model=PaymentOut,
    responses=documented(401, 404, 413, 422, 503),
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
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": PaymentNoticeIn.model_json_schema()},
            },
        },
    },
)
async def payment_callback(request: Request, ctx: Ctx) -> PaymentOut:
    """A payment succeeded or failed. Success moves the hold to paid; failure releases it; a
    success for a hold already released never brings stock back: the order needs a refund."""
    body = await request.body()  # the signature covers the exact bytes: check before parsing
    verify_signature(
        ctx.payment_secret,
        body,
        request.headers.get(SIGNATURE_HEADER),
        now=time.time(),
        tolerance_seconds=ctx.runtime.settings.payment_tolerance_seconds,
    )
    try:
        notice = PaymentNoticeIn.model_validate_json(body)
    except ValidationError as exc:  # the same 422 as a body FastAPI parsed itself
        raise RequestValidationError(exc.errors(include_url=False)) from None
    settlement, view = await ctx.orders.settle_payment(
        notice.item_id,
        int(notice.order_id),
        payment_id=notice.payment_id,
        succeeded=notice.status == "succeeded",
    )
    return PaymentOut.model_validate(
        {
            "payment_id": notice.payment_id,
            "item_id": notice.item_id,
            "order_id": notice.order_id,
            "outcome": settlement.outcome.value,
            "order_status": view.status,
            "refund_required": settlement.outcome is Outcome.REFUND_REQUIRED,
            "replayed": settlement.replayed,
        }
    )
