"""The one table from what went wrong to an HTTP answer: ``{"error": code, "message": text}``.

Every refusal the product can give is listed here once, with its status; routes raise, and the
handlers below render.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from seckill.api.limits import BodyTooLarge
from seckill.domain.holds import Reservation
from seckill.domain.ids import WorkerIdLost
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.scripts import NotDurable
from seckill.security.signatures import BadSignature
from seckill.security.tokens import InvalidToken
from seckill.services.items import UnknownItem
from seckill.services.orders import OrderNotFound
from seckill.services.purchases import RequestInFlight
from seckill.store.database import is_transient


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
}

# Invalid input is 422, except where the input is fine but the state forbids it.
_CONFLICTS = {
    ErrorCode.ITEM_ACTIVE: 409,
    ErrorCode.TOTAL_BELOW_COMMITTED: 409,
    ErrorCode.LIMIT_BELOW_COMMITTED: 409,
    ErrorCode.PAYMENT_ID_REUSED: 422,
}


def refusal(answer: Outcome | Reservation) -> ApiError:
    """The error for a refusing answer. A reservation may carry a wait (``rate_limited``),
    which goes out as ``Retry-After``."""
    outcome = answer if isinstance(answer, Outcome) else answer.outcome
    status, message = REFUSALS[outcome]
    headers = None
    if isinstance(answer, Reservation) and answer.retry_after_ms is not None:
        headers = retry_after(answer.retry_after_ms)
    return ApiError(status, outcome.value, message, headers)


def retry_after(ms: int) -> dict[str, str]:
    """``Retry-After`` in whole seconds, rounded up, at least 1 (HTTP has no finer unit)."""
    return {"Retry-After": str(max(1, math.ceil(ms / 1000)))}


def _render(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Any:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


def _status_name(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
        status, f"http_{status}"
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Any:
        return _render(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(InvalidRequest)
    async def invalid(_: Request, exc: InvalidRequest) -> Any:
        return _render(_CONFLICTS.get(exc.code, 422), exc.code.value, exc.message)

    @app.exception_handler(UnknownItem)
    async def unknown_item(_: Request, exc: UnknownItem) -> Any:
        return _render(404, Outcome.UNKNOWN_ITEM.value, str(exc))

    @app.exception_handler(OrderNotFound)
    async def unknown_order(_: Request, exc: OrderNotFound) -> Any:
        return _render(404, Outcome.UNKNOWN_ORDER.value, str(exc))

    @app.exception_handler(RequestInFlight)
    async def in_flight(_: Request, exc: RequestInFlight) -> Any:
        return _render(409, "request_in_flight", str(exc), {"Retry-After": "1"})

    @app.exception_handler(InvalidToken)
    async def bad_token(_: Request, exc: InvalidToken) -> Any:
        return _render(401, "invalid_token", str(exc), {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(BadSignature)
    async def bad_signature(_: Request, exc: BadSignature) -> Any:
        return _render(401, "invalid_signature", str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()
        )
        return _render(422, "invalid_request", problems or "invalid request")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Any:
        # FastAPI answers 400 for anything that goes wrong while it reads a JSON body. A body
        # over the limit is 413, as when Content-Length told us; one json.loads cannot decode
        # (not UTF-8, nested too deep) is malformed JSON like any other: 422.
        if isinstance(exc.__cause__, BodyTooLarge):
            return _render(413, "body_too_large", str(exc.__cause__))
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
            return _render(422, "invalid_request", "body: not valid JSON")
        return _render(exc.status_code, _status_name(exc.status_code), str(exc.detail))

    # Outages: the request was not accepted; the client may retry (with the same key).
    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def redis_down(_: Request, exc: Exception) -> Any:
        return _render(503, "redis_unavailable", "Redis is unreachable", {"Retry-After": "1"})

    # Written on the primary but not yet on enough replicas: not a yes. A retry with the same key
    # replays the same answer, checked again.
    @app.exception_handler(NotDurable)
    async def not_durable(_: Request, exc: NotDurable) -> Any:
        return _render(503, "not_durable", str(exc), {"Retry-After": "1"})

    @app.exception_handler(WorkerIdLost)
    async def no_ids(_: Request, exc: WorkerIdLost) -> Any:
        return _render(503, "redis_unavailable", str(exc), {"Retry-After": "1"})

    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(OSError)
    async def database_down(_: Request, exc: Exception) -> Any:
        if is_transient(exc):
            return _render(503, "database_unavailable", "the database is unreachable",
                           {"Retry-After": "5"})  # fmt: skip
        return _render(500, "internal_error", "the database refused the request")


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error responses a route declares in the OpenAPI schema."""
    return {status: {"model": Error} for status in statuses}
