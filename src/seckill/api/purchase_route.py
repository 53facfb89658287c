"""The purchase route, ``POST /api/v1/items/{item_id}/orders``, served ahead of the framework.

It is the one route a stampede hits. Through FastAPI's machinery (middleware layers, dependency
resolution, wrapped sends) a purchase cost about 0.75 ms of CPU, six times the purchase itself;
here the same rules run as plain code, in this order:

1. admission: beyond ``admission_max_in_flight`` purchases in flight, 503 ``overloaded`` at once;
2. the body's size: over ``max_body_bytes``, 413 before it is read whole;
3. the bearer token: 401 ``invalid_token``, 403 ``forbidden`` for an admin's;
4. the item id and the body (``{"quantity": n}``, optional): 422 ``invalid_request``;
5. the ``Idempotency-Key`` (400 without one) and the ticket (403 ``invalid_ticket``);
6. the purchase: ``Purchases.buy``, one Redis round trip (the sold-out flag before it).

Everything else is shared with the other routes: the answers to errors (``seckill.api.errors``),
the JSON responder and the body limit (``seckill.api.responses``), the request id
(``seckill.api.request_ids``), the metrics (``seckill.api.metrics``), the path
(``seckill.api.paths``). The route is declared in ``seckill.api.buyers`` for the OpenAPI schema,
and the schema tests hold it to it.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from seckill.api.admission import RETRY_AFTER, Admission
from seckill.api.auth import authorize, bearer_token
from seckill.api.context import Context
from seckill.api.errors import REFUSALS, ApiError, answer_for, refusal, validation_message
from seckill.api.metrics import record_request
from seckill.api.paths import PURCHASE_PATH, PURCHASE_ROUTE
from seckill.api.request_ids import HEADER as REQUEST_ID_HEADER
from seckill.api.request_ids import request_id_from
from seckill.api.responses import (
    CONNECTION_CLOSE,
    BodyLimit,
    BodyTooLarge,
    ClientGone,
    Header,
    error_body,
    send_json,
)
from seckill.api.schemas import BuyIn, ReservationOut
from seckill.domain.orders import OrderStatus
from seckill.domain.rules import MAX_ID
from seckill.domain.times import ms_to_datetime
from seckill.observability import metrics
from seckill.observability.logs import REQUEST_ID
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role

log = logging.getLogger(__name__)

# ASCII digits, no more of them than the largest id has: int() never parses a long string.
_ITEM_ID = re.compile(f"[0-9]{{1,{len(str(MAX_ID))}}}")
_TICKET = TICKET_HEADER.lower().encode()
_NO_BODY = BuyIn()

# The refusals a stampede gets by the thousand, encoded once.
_ENCODED = {
    (outcome.value, message): error_body(outcome.value, message)
    for outcome, (_, message) in REFUSALS.items()
}


def idempotency_key(header: str | None) -> str:
    """The key of an ``Idempotency-Key`` header; 400 ``idempotency_key_required`` without one."""
    if header is None:
        raise ApiError(400, "idempotency_key_required", "send an Idempotency-Key header")
    # The draft's value is a structured-field string ("..."); a bare token is accepted too.
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    return key


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    outcome: str  # what the metrics count: "reserved", or the error code
    headers: list[Header]  # after the content type, length and request id

    @classmethod
    def error(cls, problem: ApiError) -> Answer:
        body = _ENCODED.get((problem.code, problem.message))
        if body is None:
            body = error_body(problem.code, problem.message)
        extra = [(k.lower().encode(), v.encode()) for k, v in (problem.headers or {}).items()]
        return cls(problem.status, body, problem.code, extra)


class PurchaseRoute:
    """The ASGI app for the purchase path; ``context`` is set when the API starts."""

    def __init__(self, *, max_in_flight: int, max_body_bytes: int) -> None:
        self.context: Context | None = None
        self.admission = Admission(max_in_flight)
        self.body_limit = BodyLimit(max_body_bytes)
        self._too_large = Answer(413, self.body_limit.refusal, "body_too_large", [CONNECTION_CLOSE])
        self._shed = Answer(503, self.admission.refusal, "overloaded", [RETRY_AFTER])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = request_id_from(headers.get(REQUEST_ID_HEADER, b""))
        if not self.admission.try_enter():
            metrics.SHED.inc()
            shed = self._shed
            await send_json(send, shed.status, shed.body, shed.headers, request_id)
            record_request(PURCHASE_ROUTE, shed.outcome, started)
            return
        logged_as = REQUEST_ID.set(request_id)  # every log line of this purchase carries it
        try:
            try:
                answer = await self._decide(scope, receive, headers, request_id)
            except ClientGone:
                return
            except BodyTooLarge:
                answer = self._too_large
            except Exception as exc:
                answer = self._answer_to(exc)
            await send_json(send, answer.status, answer.body, answer.headers, request_id)
        finally:
            self.admission.leave()
            REQUEST_ID.reset(logged_as)
        record_request(PURCHASE_ROUTE, answer.outcome, started)

    async def _decide(
        self, scope: Scope, receive: Receive, headers: dict[bytes, bytes], request_id: str
    ) -> Answer:
        ctx = self.context
        if ctx is None:
            raise RuntimeError("the purchase route was called before the API started")
        body = await self.body_limit.read(receive, headers.get(b"content-length"))
        token = bearer_token(_text(headers.get(b"authorization")))
        buyer = authorize(ctx.tokens, token, Role.BUYER)
        item_id = _item_id(scope["path"])
        quantity = _quantity(body, headers.get(b"content-type")).quantity
        key = idempotency_key(_text(headers.get(b"idempotency-key")))
        ctx.tickets.check(_text(headers.get(_TICKET)), item_id=item_id, buyer=buyer.subject)
        reservation = await ctx.purchases.buy(
            item_id,
            buyer=buyer.subject,
            quantity=quantity,
            idempotency_key=key,
            request_id=request_id,
        )
        if not reservation.accepted:
            raise refusal(reservation)
        assert reservation.order_id is not None and reservation.deadline_ms is not None
        held = ReservationOut(
            order_id=str(reservation.order_id),
            item_id=item_id,
            quantity=quantity,
            status=OrderStatus.HELD,
            pay_before=ms_to_datetime(reservation.deadline_ms),
        )
        return Answer(202, held.model_dump_json().encode(), "reserved", [])

    def _answer_to(self, exc: Exception) -> Answer:
        problem = answer_for(exc)
        if problem is None:
            log.exception("purchase failed")
            problem = ApiError(500, "internal_error", "the purchase failed: see the server's log")
        return Answer.error(problem)


def _text(value: bytes | None) -> str | None:
    # Header values as the framework reads them: Latin-1, so any byte decodes.
    return None if value is None else value.decode("latin-1")


def _item_id(path: str) -> int:
    match = PURCHASE_PATH.fullmatch(path)
    text = match.group(1) if match else ""
    if _ITEM_ID.fullmatch(text) and 1 <= int(text) <= MAX_ID:
        return int(text)
    raise ApiError(422, "invalid_request", f"path.item_id: an integer from 1 to {MAX_ID}")


def _quantity(body: bytes, content_type: bytes | None) -> BuyIn:
    """The body as ``BuyIn``: none at all buys one unit."""
    if not body:
        return _NO_BODY
    if content_type is not None and not _is_json(content_type):
        raise ApiError(422, "invalid_request", "body: send it as application/json")
    try:
        return BuyIn.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        if any(e["type"] == "json_invalid" for e in errors):
            raise ApiError(422, "invalid_request", "body: not valid JSON") from None
        located = [{**e, "loc": ("body", *e["loc"])} for e in errors]
        raise ApiError(422, "invalid_request", validation_message(located)) from None


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )
