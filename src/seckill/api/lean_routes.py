"""The buyer routes a stampede hits, served ahead of the framework.

Every buyer of a sale reads the item, takes a ticket and buys, all in the same second. Through
FastAPI's machinery (middleware layers, dependency resolution, response models, wrapped sends)
each of these cost several times its own work, so they are served here as plain code, through
ASGI (``LeanRoutes.serve``: under granian, and behind CORS) or, under uvicorn, on the
connection itself (``seckill.api.lean_http``), both answering through ``LeanRoutes.respond``:

* ``GET /api/v1/items/{item_id}``: the item as buyers see it (the cache in front of SQL, the
  units left read live, or 0 with no read while this process's sold-out flag stands);
* ``POST /api/v1/items/{item_id}/tickets``: a purchase ticket for the caller (409 ``sold_out``
  with no Redis call while the flag stands);
* ``POST`` and ``GET /api/v1/items/{item_id}/queue``: join the waiting room, and ask where one
  stands (for an item created with one; else 404 ``no_waiting_room``);
* ``POST /api/v1/items/{item_id}/orders``: the purchase. In this order: the body's size (413
  before it is read whole); admission (beyond ``admission_max_in_flight`` purchases in flight,
  503 ``overloaded`` at once); the bearer token (401, 403 for an admin's); the item id and the
  body (``{"quantity": n}``, optional; read by ``seckill.api.bodies``: 415, 422); the
  ``Idempotency-Key`` (400 without one) and the ticket (403 ``invalid_ticket``); then
  ``Purchases.buy``, one Redis round trip (the sold-out flag before it);
* ``GET /livez``: the liveness probe, answered with no I/O at all.

Each request gets what the framework's layers give the other routes, from the same places: the
request id (``seckill.api.request_ids``), the body limit and the JSON answer
(``seckill.api.responses``), the answers to errors (``seckill.api.errors``), the metrics
(``seckill.api.metrics``). Every route stays declared for the OpenAPI schema (in
``seckill.api.buyers``, ``seckill.api.tickets``, ``seckill.api.queue`` and
``seckill.api.health``), and the schema tests hold the answers given here to it. Anything else
(another method, a trailing slash) goes on to the framework.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from starlette.types import Receive, Scope, Send

from seckill.api.admission import RETRY_AFTER, Admission
from seckill.api.auth import authorize, bearer_token
from seckill.api.bodies import parse_body
from seckill.api.buyers import item_out
from seckill.api.errors import REFUSALS, ApiError, answer_for, refusal
from seckill.api.metrics import record_request
from seckill.api.paths import (
    ITEM_ROUTE,
    LIVEZ_ROUTE,
    PURCHASE_ROUTE,
    QUEUE_ROUTE,
    TICKET_ROUTE,
    route_pattern,
)
from seckill.api.query_strings import check_query_once
from seckill.api.queue import standing_out
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
from seckill.api.schemas import BuyIn, LiveOut
from seckill.api.tickets import ticket_out
from seckill.bootstrap.services import Context
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import ApiRefusal, Outcome
from seckill.domain.rules import MAX_ID
from seckill.observability import metrics
from seckill.observability.logs import REQUEST_ID
from seckill.security.passes import PASS_HEADER
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role
from seckill.services.items import item_on_sale
from seckill.services.sold_out import SoldOut

log = logging.getLogger(__name__)

# ASCII digits, no more of them than the largest id has: int() never parses a long string.
_ITEM_ID = re.compile(f"[0-9]{{1,{len(str(MAX_ID))}}}")
_TICKET = TICKET_HEADER.lower().encode()
_PASS = PASS_HEADER.lower().encode()
# A standing may be a second old anyway (each process reads a queue's front once for all).
_CACHE_A_SECOND = [(b"cache-control", b"private, max-age=1")]
_NO_BODY = BuyIn()
# Purchase bodies read before, by (body, content type): reading one is a pure function of the
# two, and a crowd sends a handful of distinct ones. Bounded: past it, each is read anew.
_BODIES_READ: dict[tuple[bytes, bytes | None], BuyIn] = {}
_REMEMBERED_BODIES = 256
_REMEMBERED_BODY_BYTES = 64


class Answer(NamedTuple):  # a tuple, not a frozen dataclass: built per request at half the cost
    status: int
    body: bytes
    outcome: str  # what the metrics count: "reserved", "200", or the error code
    headers: list[Header]  # after the content type, length and request id

    @classmethod
    def error(cls, problem: ApiError) -> Answer:
        extra = [(k.lower().encode(), v.encode()) for k, v in (problem.headers or {}).items()]
        return cls(problem.status, error_body(problem.code, problem.message), problem.code, extra)


# The refusals a stampede gets by the thousand, answered once.
_REFUSED = {outcome: Answer.error(refusal(outcome)) for outcome in REFUSALS}
_ALIVE = Answer(200, LiveOut(status="alive").model_dump_json().encode(), "200", [])


class Request(NamedTuple):
    """What a route reads of its request."""

    item_id: int  # 0 on a route without one (the liveness probe)
    headers: dict[bytes, bytes]
    body: bytes
    request_id: str


Decide = Callable[[Context, Request], Awaitable[Answer]]


@dataclass(frozen=True, slots=True)
class LeanRoute:
    method: str
    template: str  # the schema's path, and the metrics' ``route`` label
    decide: Decide
    admitted: bool = False  # held to the admission limit (the purchase)
    takes_body: bool = False  # read whole (under the limit); else only its length is checked
    pattern: re.Pattern[str] = field(init=False)  # group 1: the item id as sent

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", route_pattern(self.template))


class LeanRoutes:
    """The ASGI app for the lean routes; ``context`` is set when the API starts."""

    def __init__(self, *, max_in_flight: int, max_body_bytes: int) -> None:
        self.context: Context | None = None
        self.admission = Admission(max_in_flight)
        self.body_limit = BodyLimit(max_body_bytes)
        self._too_large = Answer(
            413, self.body_limit.refusal, ApiRefusal.BODY_TOO_LARGE, [CONNECTION_CLOSE]
        )
        self._shed = Answer(503, self.admission.refusal, ApiRefusal.OVERLOADED, [RETRY_AFTER])
        self._routes = [
            LeanRoute("POST", PURCHASE_ROUTE, buy, admitted=True, takes_body=True),
            LeanRoute("POST", TICKET_ROUTE, issue_ticket),
            LeanRoute("GET", ITEM_ROUTE, read_item),
            LeanRoute("POST", QUEUE_ROUTE, join_queue),
            LeanRoute("GET", QUEUE_ROUTE, queue_standing),
            LeanRoute("GET", LIVEZ_ROUTE, alive),
        ]

    def route_of(self, scope: Scope) -> LeanRoute | None:
        """The lean route that serves this ASGI request, if one does."""
        if scope["type"] != "http":
            return None
        return self.route_for(scope["method"], scope["path"])

    def route_for(self, method: str, path: str) -> LeanRoute | None:
        """The lean route that serves ``method`` on ``path`` (decoded), if one does."""
        for route in self._routes:
            if route.method == method and route.pattern.fullmatch(path):
                return route
        return None

    async def serve(self, route: LeanRoute, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an ASGI request (the way in under granian, and behind CORS)."""
        headers = dict(scope["headers"])
        body: bytes | None
        try:
            body = await self._read_body(route, receive, headers.get(b"content-length"))
        except ClientGone:
            return
        except BodyTooLarge:
            body = None
        answer, request_id = await self.respond(
            route, scope["path"], scope["query_string"], headers, body
        )
        await send_json(send, answer.status, answer.body, answer.headers, request_id)

    async def respond(
        self,
        route: LeanRoute,
        path: str,
        query_string: bytes,
        headers: dict[bytes, bytes],
        body: bytes | None,
    ) -> tuple[Answer, str]:
        """The answer to a request, and its request id: counted and timed in the metrics, every
        log line meanwhile carrying the id. ``body`` is the whole body the route reads (b""
        for one that takes none), or None if it went over the limit. Every way in answers
        through here (``serve`` for ASGI, ``seckill.api.lean_http`` on the connection)."""
        started = time.perf_counter()
        request_id = request_id_from(headers.get(REQUEST_ID_HEADER, b""))
        if body is None:
            answer = self._too_large
        elif route.admitted and not self.admission.try_enter():
            metrics.SHED.inc()
            answer = self._shed
        else:
            logged_as = REQUEST_ID.set(request_id)  # every log line of this request carries it
            try:
                answer = await self._answer(route, path, query_string, headers, body, request_id)
            except Exception as exc:
                answer = _answer_to(exc, route)
            finally:
                if route.admitted:
                    self.admission.leave()
                REQUEST_ID.reset(logged_as)
        record_request(route.template, answer.outcome, started)
        return answer, request_id

    async def _read_body(
        self, route: LeanRoute, receive: Receive, content_length: bytes | None
    ) -> bytes:
        # The limit holds as on the framework's routes: a route that takes no body never reads
        # one, so only a Content-Length over the limit is refused.
        if route.takes_body:
            return await self.body_limit.read(receive, content_length)
        if self.body_limit.refuses_length(content_length):
            raise BodyTooLarge(self.body_limit.message)
        return b""

    async def _answer(
        self,
        route: LeanRoute,
        path: str,
        query_string: bytes,
        headers: dict[bytes, bytes],
        body: bytes,
        request_id: str,
    ) -> Answer:
        if route.decide is alive:  # liveness asks nothing of the runtime, open or not
            return _ALIVE
        ctx = self.context
        if ctx is None:
            raise RuntimeError("a lean route was called before the API started")
        if query_string:  # none of these routes takes one; still, each name once
            check_query_once(query_string)
        item_id = _item_id(route.pattern, path) if route.pattern.groups else 0
        return await route.decide(ctx, Request(item_id, headers, body, request_id))


async def alive(ctx: Context, request: Request) -> Answer:
    """``GET /livez``: the process serves (``_answer`` gives this before it needs a context)."""
    return _ALIVE


async def read_item(ctx: Context, request: Request) -> Answer:
    seen = await item_on_sale(
        ctx.item_cache, request.item_id, ledger=ctx.ledger, sold_out=ctx.sold_out
    )
    return Answer(200, item_out(seen).model_dump_json().encode(), "200", [])


async def issue_ticket(ctx: Context, request: Request) -> Answer:
    buyer = _caller(ctx, request.headers, Role.BUYER)
    try:
        text, ticket = await ctx.tickets.issue(request.item_id, buyer=buyer)
    except SoldOut:
        return _REFUSED[Outcome.SOLD_OUT]  # the crowd after the last unit: an answer built once
    return Answer(200, ticket_out(text, ticket).model_dump_json().encode(), "200", [])


async def join_queue(ctx: Context, request: Request) -> Answer:
    buyer = _caller(ctx, request.headers, Role.BUYER)
    found = await ctx.waiting_room.join(request.item_id, buyer)
    return Answer(200, standing_out(found).model_dump_json().encode(), "200", [])


async def queue_standing(ctx: Context, request: Request) -> Answer:
    buyer = _caller(ctx, request.headers, Role.BUYER)
    queue_pass = _text(request.headers.get(_PASS))
    found = await ctx.waiting_room.standing(request.item_id, buyer, queue_pass)
    return Answer(200, standing_out(found).model_dump_json().encode(), "200", _CACHE_A_SECOND)


async def buy(ctx: Context, request: Request) -> Answer:
    headers, item_id = request.headers, request.item_id
    buyer = _caller(ctx, headers, Role.BUYER)
    quantity = _quantity(request.body, headers.get(b"content-type")).quantity
    key = idempotency_key(_text(headers.get(b"idempotency-key")))
    ctx.tickets.check(_text(headers.get(_TICKET)), item_id=item_id, buyer=buyer)
    reservation = await ctx.purchases.buy(
        item_id,
        buyer=buyer,
        quantity=quantity,
        idempotency_key=key,
        request_id=request.request_id,
    )
    if not reservation.accepted:
        if reservation.retry_after_ms is None:
            return _REFUSED[reservation.outcome]
        return Answer.error(refusal(reservation))  # with its Retry-After
    assert reservation.order_id is not None and reservation.deadline_ms is not None
    held = held_body(reservation.order_id, item_id, quantity, reservation.deadline_ms)
    return Answer(202, held, "reserved", [])


def held_body(order_id: int, item_id: int, quantity: int, deadline_ms: int) -> bytes:
    """The 202's body, byte for byte what ``ReservationOut`` writes (tests/unit/test_lean_routes.py
    holds them equal): formatted here because the model costs a purchase 6 µs, this 2."""
    seconds, ms = divmod(deadline_ms, 1000)
    when = _second(seconds)
    fraction = f".{ms:03d}000" if ms else ""  # pydantic writes microseconds, or none
    return (
        f'{{"order_id":"{order_id}","item_id":{item_id},"quantity":{quantity},'
        f'"status":"{OrderStatus.HELD.value}","pay_before":"{when}{fraction}Z"}}'
    ).encode()


@functools.lru_cache(maxsize=4)  # a burst's deadlines fall in the same few seconds
def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def idempotency_key(header: str | None) -> str:
    """The key of an ``Idempotency-Key`` header; 400 ``idempotency_key_required`` without one."""
    if header is None:
        raise ApiError(400, ApiRefusal.IDEMPOTENCY_KEY_REQUIRED, "send an Idempotency-Key header")
    # The draft's value is a structured-field string ("..."); a bare token is accepted too.
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    return key


def _caller(ctx: Context, headers: dict[bytes, bytes], role: Role) -> str:
    token = bearer_token(_text(headers.get(b"authorization")))
    return authorize(ctx.tokens, token, role).subject


def _answer_to(exc: Exception, route: LeanRoute) -> Answer:
    problem = answer_for(exc)
    if problem is None:
        log.exception("%s %s failed", route.method, route.template)
        problem = ApiError(
            500, ApiRefusal.INTERNAL_ERROR, "the request failed: see the server's log"
        )
    return Answer.error(problem)


def _text(value: bytes | None) -> str | None:
    # Header values as the framework reads them: Latin-1, so any byte decodes.
    return None if value is None else value.decode("latin-1")


def _item_id(pattern: re.Pattern[str], path: str) -> int:
    match = pattern.fullmatch(path)
    text = match.group(1) if match else ""
    if _ITEM_ID.fullmatch(text) and 1 <= int(text) <= MAX_ID:
        return int(text)
    raise ApiError(422, ApiRefusal.INVALID_REQUEST, f"path.item_id: an integer from 1 to {MAX_ID}")


def _quantity(body: bytes, content_type: bytes | None) -> BuyIn:
    """The body as ``BuyIn``: none at all buys one unit; one sent is read as every body is,
    once: a crowd sends the same few bodies, so what a short one said is remembered."""
    if not body:
        return _NO_BODY
    key = (body, content_type)
    read = _BODIES_READ.get(key)
    if read is None:
        read = parse_body(BuyIn, body, content_type)  # a refused body raises: never remembered
        if len(body) <= _REMEMBERED_BODY_BYTES and len(_BODIES_READ) < _REMEMBERED_BODIES:
            _BODIES_READ[key] = read
    return read
