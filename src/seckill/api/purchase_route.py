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
the request id (``seckill.api.request_ids``), the metrics (``seckill.api.metrics``). The route is
declared in ``seckill.api.buyers`` for the OpenAPI schema, and the schema tests hold it to it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from seckill.api.admission import PURCHASE_PATH, Admission
from seckill.api.auth import authorize, bearer_token
from seckill.api.context import Context
from seckill.api.errors import REFUSALS, ApiError, answer_for, refusal, validation_message
from seckill.api.limits import too_large
from seckill.api.metrics import PURCHASE_ROUTE, record_request
from seckill.api.request_ids import HEADER as REQUEST_ID_HEADER
from seckill.api.request_ids import request_id_from
from seckill.api.schemas import BuyIn, ReservationOut
from seckill.domain.orders import OrderStatus
from seckill.observability import metrics
from seckill.observability.logs import REQUEST_ID
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role
from seckill.store.tables import ms_to_datetime

log = logging.getLogger(__name__)

MAX_ITEM_ID = 2**63 - 1
_ITEM_ID = re.compile(r"[0-9]{1,19}")
_TICKET = TICKET_HEADER.lower().encode()
_NO_BODY = BuyIn()

Headers = list[tuple[bytes, bytes]]
_JSON: Headers = [(b"content-type", b"application/json")]
# The refusals a stampede gets by the thousand, encoded once.
_ENCODED = {
    (outcome.value, message): json.dumps({"error": outcome.value, "message": message}).encode()
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
    headers: Headers

    @classmethod
    def error(cls, problem: ApiError) -> Answer:
        body = _ENCODED.get((problem.code, problem.message))
        if body is None:
            body = json.dumps({"error": problem.code, "message": problem.message}).encode()
        extra = [(k.lower().encode(), v.encode()) for k, v in (problem.headers or {}).items()]
        return cls(problem.status, body, problem.code, extra)


class ClientGone(Exception):
    """The client went away before its request was whole: there is no one to answer."""


class PurchaseRoute:
    """The ASGI app for the purchase path; ``context`` is set when the API starts."""

    def __init__(self, *, max_in_flight: int, max_body_bytes: int) -> None:
        self.context: Context | None = None
        self.admission = Admission(max_in_flight)
        self._max_body_bytes = max_body_bytes
        self._too_large = ApiError(
            413, "body_too_large", too_large(max_body_bytes), {"Connection": "close"}
        )
        self._shed = Answer(503, self.admission.refusal, "overloaded", [(b"retry-after", b"1")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = request_id_from(headers.get(REQUEST_ID_HEADER, b""))
        if not self.admission.try_enter():
            metrics.SHED.inc()
            await _send(send, self._shed, request_id)
            record_request(PURCHASE_ROUTE, self._shed.outcome, started)
            return
        logged_as = REQUEST_ID.set(request_id)  # every log line of this purchase carries it
        try:
            try:
                answer = await self._decide(scope, receive, headers, request_id)
            except ClientGone:
                return
            except Exception as exc:
                answer = self._answer_to(exc)
            await _send(send, answer, request_id)
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
        body = await self._body(receive, headers)
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

    async def _body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes:
        """The whole body, refused as soon as it is known to be over the limit."""
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self._max_body_bytes):
            raise self._too_large
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            body += bytes(message.get("body", b""))
            if len(body) > self._max_body_bytes:
                raise self._too_large
            if not message.get("more_body", False):
                return body

    def _answer_to(self, exc: Exception) -> Answer:
        problem = answer_for(exc)
        if problem is None:
            log.exception("purchase failed")
            problem = ApiError(500, "internal_error", "the purchase failed: see the server's log")
        return Answer.error(problem)


async def _send(send: Send, answer: Answer, request_id: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [
                *_JSON,
                (b"content-length", str(len(answer.body)).encode()),
                (REQUEST_ID_HEADER, request_id.encode()),
                *answer.headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer.body})


def _text(value: bytes | None) -> str | None:
    # Header values as the framework reads them: Latin-1, so any byte decodes.
    return None if value is None else value.decode("latin-1")


def _item_id(path: str) -> int:
    match = PURCHASE_PATH.fullmatch(path)
    text = match.group(1) if match else ""
    if _ITEM_ID.fullmatch(text) and 1 <= int(text) <= MAX_ITEM_ID:
        return int(text)
    raise ApiError(422, "invalid_request", f"path.item_id: an integer from 1 to {MAX_ITEM_ID}")


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
