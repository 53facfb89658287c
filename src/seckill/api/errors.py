"""The one table from what went wrong to an HTTP answer: ``{"error": code, "message": text}``.

Every refusal the product can give is listed here once, with its status; routes raise, and the
handlers below render.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from seckill.api.responses import BodyTooLarge
from seckill.domain.holds import Reservation
from seckill.domain.ids import WorkerIdLost
from seckill.domain.outcomes import ApiRefusal, ErrorCode, InvalidRequest, Outcome
from seckill.engine.cluster import SLOT_UNAVAILABLE
from seckill.engine.scripts import NotDurable
from seckill.security.passes import BadPass
from seckill.security.signatures import BadSignature
from seckill.security.tickets import BadTicket
from seckill.security.tokens import InvalidToken
from seckill.services.items import UnknownItem
from seckill.services.orders import ItemRecovering, NotLanded, OrderLost, OrderNotFound
from seckill.services.purchases import RequestInFlight
from seckill.services.refunds import RefundNotFound
from seckill.services.sold_out import SoldOut
from seckill.services.tickets import GateRefused, SaleClosed
from seckill.services.waiting_room import NoWaitingRoom
from seckill.store.database import is_busy, is_transient


class Error(BaseModel):
    """Every error body."""

    error: str
    message: str


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


# Engine answers that refuse the request. Anything else (reserved, paid...) is a success.
REFUSALS: dict[Outcome, tuple[int, str]] = {
    Outcome.SOLD_OUT: (409, "sold out"),
    Outcome.INSUFFICIENT_STOCK: (409, "fewer units left than asked for"),
    Outcome.LIMIT_REACHED: (409, "this buyer has reached the per-buyer limit"),
    Outcome.NOT_STARTED: (403, "the sale has not started"),
    Outcome.ENDED: (403, "the sale has ended"),
    Outcome.UNKNOWN_ITEM: (404, "no such item on sale"),
    Outcome.KEY_REUSED: (422, "this idempotency key was used with another request body"),
    Outcome.RATE_LIMITED: (429, "too many purchase attempts; retry after the time given"),
    Outcome.ALREADY_PAID: (409, "the order is paid"),
    Outcome.UNKNOWN_ORDER: (404, "no such order"),
    Outcome.ITEM_RECOVERING: (
        503,
        "this item's Redis restarted or lost writes: it sells again once checked against SQL",
    ),
}
# Refusals the caller should retry shortly, by themselves.
_RETRY_SOON = {Outcome.ITEM_RECOVERING: {"Retry-After": "1"}}

# Invalid input is 422, except where the input is fine but the state forbids it.
_CONFLICTS = {
    ErrorCode.ITEM_ACTIVE: 409,
    ErrorCode.ITEM_ARCHIVED: 409,
    ErrorCode.ITEM_UNSETTLED: 409,
    ErrorCode.SALE_NOT_STARTED: 409,
    ErrorCode.INVALID_GROUP: 422,
    ErrorCode.TOTAL_BELOW_COMMITTED: 409,
    ErrorCode.LIMIT_BELOW_COMMITTED: 409,
    ErrorCode.PAYMENT_ID_REUSED: 422,
}


def refusal(answer: Outcome | Reservation) -> ApiError:
    """The error for a refusing answer. A reservation may carry a wait (``rate_limited``),
    which goes out as ``Retry-After``."""
    outcome = answer if isinstance(answer, Outcome) else answer.outcome
    status, message = REFUSALS[outcome]
    headers = _RETRY_SOON.get(outcome)
    if isinstance(answer, Reservation) and answer.retry_after_ms is not None:
        headers = retry_after(answer.retry_after_ms)
    return ApiError(status, outcome.value, message, headers)


def retry_after(ms: int) -> dict[str, str]:
    """``Retry-After`` in whole seconds, rounded up, at least 1 (HTTP has no finer unit)."""
    return {"Retry-After": str(max(1, math.ceil(ms / 1000)))}


def _render(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Any:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


def _status_name(status: int) -> str:
    return {
        404: ApiRefusal.NOT_FOUND,
        405: ApiRefusal.METHOD_NOT_ALLOWED,
        413: ApiRefusal.BODY_TOO_LARGE,
    }.get(status, f"http_{status}")


def answer_for(exc: Exception) -> ApiError | None:
    """The answer to an exception the product raises on purpose, or None for one it does not
    know (a bug: 500). The framework's handlers and the lean purchase route both ask here."""
    match exc:
        case ApiError():
            return exc
        case InvalidRequest():
            return ApiError(_CONFLICTS.get(exc.code, 422), exc.code.value, exc.message)
        case UnknownItem():
            return ApiError(404, Outcome.UNKNOWN_ITEM.value, str(exc))
        case OrderNotFound():
            return ApiError(404, Outcome.UNKNOWN_ORDER.value, str(exc))
        # Issued, then lost with writes Redis lost before SQL had it: gone for good, not unknown.
        case OrderLost():
            return ApiError(410, ApiRefusal.ORDER_LOST, str(exc))
        case ItemRecovering():
            return refusal(Outcome.ITEM_RECOVERING)
        case SoldOut():
            return refusal(Outcome.SOLD_OUT)  # the purchase's own answer, word for word
        case RefundNotFound():
            return ApiError(404, ApiRefusal.UNKNOWN_REFUND, str(exc))
        case RequestInFlight():
            return ApiError(409, ApiRefusal.REQUEST_IN_FLIGHT, str(exc), {"Retry-After": "1"})
        case InvalidToken():
            return ApiError(401, ApiRefusal.INVALID_TOKEN, str(exc), {"WWW-Authenticate": "Bearer"})
        case BadSignature():
            return ApiError(401, ApiRefusal.INVALID_SIGNATURE, str(exc))
        case BadTicket():
            return ApiError(403, ApiRefusal.INVALID_TICKET, str(exc))
        case BadPass():
            return ApiError(403, ApiRefusal.INVALID_PASS, str(exc))
        case NoWaitingRoom():
            return ApiError(404, ApiRefusal.NO_WAITING_ROOM, str(exc))
        case SaleClosed():
            return ApiError(403, exc.outcome.value, str(exc))
        case GateRefused():
            retry = {"Retry-After": str(exc.decision.retry_after_seconds)}
            return ApiError(429, ApiRefusal.GATE_REFUSED, str(exc), retry)
        # Outages: the request was not accepted; the client may retry (with the same key).
        case RedisConnectionError() | RedisTimeoutError():
            return ApiError(
                503, ApiRefusal.REDIS_UNAVAILABLE, "Redis is unreachable", {"Retry-After": "1"}
            )
        case _ if isinstance(exc, SLOT_UNAVAILABLE):
            message = "this item's Redis Cluster slot is unavailable or moving"
            return ApiError(503, ApiRefusal.REDIS_UNAVAILABLE, message, {"Retry-After": "1"})
        # Written on the primary but not yet on enough replicas: not a yes. A retry with the same
        # key replays the same answer, checked again.
        case NotDurable() | NotLanded():
            return ApiError(503, ApiRefusal.NOT_DURABLE, str(exc), {"Retry-After": "1"})
        case WorkerIdLost():
            return ApiError(503, ApiRefusal.REDIS_UNAVAILABLE, str(exc), {"Retry-After": "1"})
        # Busy (a lock, a pooled connection, a turn to write not free within the request's
        # deadline) soon passes; unreachable may last.
        case SQLAlchemyError() | OSError() if is_transient(exc) and is_busy(exc):
            message = "the database is busy: it did not take this request within its deadline"
            return ApiError(503, ApiRefusal.DATABASE_BUSY, message, {"Retry-After": "1"})
        case SQLAlchemyError() | OSError() if is_transient(exc):
            return ApiError(503, ApiRefusal.DATABASE_UNAVAILABLE, "the database is unreachable",
                            {"Retry-After": "5"})  # fmt: skip
        case SQLAlchemyError() | OSError():
            return ApiError(500, ApiRefusal.INTERNAL_ERROR, "the database refused the request")
    return None


# Every exception type answer_for knows (subclasses included), for the framework's handlers.
ANSWERED: tuple[type[Exception], ...] = (
    ApiError, InvalidRequest, UnknownItem, OrderNotFound, OrderLost, ItemRecovering, SoldOut,
    RefundNotFound, RequestInFlight,
    InvalidToken,
    BadSignature, BadTicket, BadPass, NoWaitingRoom, SaleClosed, GateRefused, RedisConnectionError,
    RedisTimeoutError, NotDurable, NotLanded, WorkerIdLost, SQLAlchemyError, OSError,
    *SLOT_UNAVAILABLE,
)  # fmt: skip


def install_error_handlers(app: FastAPI) -> None:
    async def answered(_: Request, exc: Exception) -> Any:
        answer = answer_for(exc)
        if answer is None:
            raise exc
        return _render(answer.status, answer.code, answer.message, answer.headers)

    for kind in ANSWERED:
        app.add_exception_handler(kind, answered)

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> Any:
        return _render(422, ApiRefusal.INVALID_REQUEST, validation_message(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Any:
        # FastAPI answers 400 for anything that goes wrong while it reads a JSON body. A body
        # over the limit is 413, as when Content-Length told us; one json.loads cannot decode
        # (not UTF-8, nested too deep) is malformed JSON like any other: 422.
        if isinstance(exc.__cause__, BodyTooLarge):
            return _render(413, ApiRefusal.BODY_TOO_LARGE, str(exc.__cause__))
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
            return _render(422, ApiRefusal.INVALID_REQUEST, "body: not valid JSON")
        return _render(exc.status_code, _status_name(exc.status_code), str(exc.detail))


def validation_message(errors: Sequence[Any]) -> str:
    """Validation errors in one line: ``where: what`` for each, joined by ``; ``."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors
    )
    return problems or "invalid request"


# Every 429 and 503 answer says when to come back; a 409 only when the route says so.
RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "Whole seconds to wait before trying again (the same request, the "
        "same Idempotency-Key).",
        "schema": {"type": "integer", "minimum": 1},
    }
}
_ALWAYS_RETRY_AFTER = frozenset({429, 503})


def documented(*statuses: int, retry_after: Sequence[int] = ()) -> dict[int | str, dict[str, Any]]:
    """The error responses a route declares in the OpenAPI schema: each with the error body,
    and ``Retry-After`` on 429, 503 and the statuses in ``retry_after``."""
    return {
        status: (
            {"model": Error, "headers": RETRY_AFTER_HEADER}
            if status in _ALWAYS_RETRY_AFTER or status in retry_after
            else {"model": Error}
        )
        for status in statuses
    }
