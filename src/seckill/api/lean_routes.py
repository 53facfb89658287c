"""The buyer routes a stampede hits, served ahead of the framework.

Every buyer of a sale reads the item, takes a ticket and buys, all in the same second. Through
FastAPI's machinery (middleware layers, dependency resolution, response models, wrapped sends)
each of these cost several times its own work, so they are served here as plain code, through
ASGI (``LeanRoutes.serve``: under granian, and behind CORS) or, under uvicorn, on the
connection itself (``seckill.api.lean_http``), both answering through ``LeanRoutes.respond``:

* ``GET /api/v1/items/{item_id}`` and ``POST /api/v1/items/{item_id}/orders``, the item read and
  the purchase (``seckill.api.buyers``);
* ``POST /api/v1/items/{item_id}/tickets``, a purchase ticket (``seckill.api.tickets``);
* ``POST`` and ``GET /api/v1/items/{item_id}/queue``, the waiting room (``seckill.api.queue``);
* ``GET /livez``: the liveness probe, answered here with no I/O at all.

Each route is declared once, as a ``LeanRoute``: how it is served (its decide function, the
bearer token's role, admission, its body) and what its OpenAPI entry says, which
``seckill.api.lean_schema`` renders into the app's schema. Before its decide function runs, a
route's request is read in this order: the body's size (413 before it is read whole);
admission (beyond ``admission_max_in_flight`` purchases in flight, 503 ``overloaded`` at once);
the query string (each name once), the item id (422) and the bearer token (401, 403 for another
role's).

Each request gets what the framework's layers give the other routes, from the same places: the
request id (``seckill.api.request_ids``), the body limit and the JSON answer
(``seckill.api.responses``), the answers to errors (``seckill.api.errors``), the metrics
(``seckill.api.metrics``). Anything else (another method, a trailing slash) goes on to the
framework, whose router knows each lean route's path (``LeanPath``): another method is 405 and a
trailing slash is redirected, as on its own routes.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from seckill.api.admission import RETRY_AFTER, Admission
from seckill.api.auth import authorize, bearer_token
from seckill.api.errors import REFUSALS, ApiError, answer_for, refusal
from seckill.api.metrics import record_request
from seckill.api.paths import LIVEZ_ROUTE, route_pattern
from seckill.api.query_strings import check_query_once
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
from seckill.api.schemas import LiveOut
from seckill.bootstrap.services import Context
from seckill.domain.outcomes import ApiRefusal
from seckill.domain.rules import MAX_ID
from seckill.observability import metrics
from seckill.observability.logs import REQUEST_ID
from seckill.security.tokens import Role

log = logging.getLogger(__name__)

# ASCII digits, no more of them than the largest id has: int() never parses a long string.
_ITEM_ID = re.compile(f"[0-9]{{1,{len(str(MAX_ID))}}}")


class Answer(NamedTuple):  # a tuple, not a frozen dataclass: built per request at half the cost
    status: int
    body: bytes
    outcome: str  # what the metrics count: "reserved", "200", or the error code
    headers: list[Header]  # after the content type, length and request id

    @classmethod
    def error(cls, problem: ApiError) -> Answer:
        extra = [(k.lower().encode(), v.encode()) for k, v in (problem.headers or {}).items()]
        return cls(problem.status, error_body(problem.code, problem.message), problem.code, extra)


REFUSED = {outcome: Answer.error(refusal(outcome)) for outcome in REFUSALS}
"""The refusals a stampede gets by the thousand, answered once."""
_ALIVE = Answer(200, LiveOut(status="alive").model_dump_json().encode(), "200", [])


class Request(NamedTuple):
    """What a route reads of its request."""

    item_id: int  # 0 on a route without one (the liveness probe)
    caller: str  # the bearer token's subject; "" on a route for anyone
    headers: dict[bytes, bytes]
    body: bytes
    request_id: str


Decide = Callable[[Context, Request], Awaitable[Answer]]
_NOTHING_ASKED = Request(0, "", {}, b"", "")  # what the liveness probe is given


@dataclass(frozen=True, slots=True)
class HeaderParam:
    """A request header a lean route reads, as its OpenAPI entry declares it."""

    name: str
    description: str
    required: bool = False
    key: bytes = field(init=False)  # the name as the request's headers hold it

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.name.lower().encode())


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LeanRoute:
    """One lean route, declared once: how it is served, and what its OpenAPI entry says (its
    summary and description are its decide function's name and docstring, as the framework takes
    them from an endpoint's)."""

    method: str
    template: str  # the schema's path, and the metrics' ``route`` label
    decide: Decide
    caller: Role | None = None  # the bearer token's role, checked before deciding (401, 403)
    admitted: bool = False  # held to the admission limit (the purchase)
    # The JSON body it reads (optional to the client), read whole under the limit; without one,
    # only a body's announced length is checked.
    body: type[BaseModel] | None = None
    headers: tuple[HeaderParam, ...] = ()
    status: int = 200
    answer: type[BaseModel]  # the body of the success
    errors: Mapping[int | str, Mapping[str, Any]]  # as seckill.api.errors.documented gives them
    tags: tuple[str, ...] = ("buyers",)
    takes_body: bool = field(init=False)
    pattern: re.Pattern[str] = field(init=False)  # group 1: the item id as sent

    def __post_init__(self) -> None:
        object.__setattr__(self, "takes_body", self.body is not None)
        object.__setattr__(self, "pattern", route_pattern(self.template))


class LeanPath(BaseRoute):
    """A lean route's path in the framework's router. A request reaches the framework on it only
    with a method no lean route serves there (those are answered ahead of it): it is 405, as on
    the framework's own routes, and the same path with a trailing slash is redirected to it."""

    def __init__(self, template: str, methods: Collection[str]) -> None:
        self.path = template
        self.methods = sorted(methods)
        self._pattern = route_pattern(template)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        # The path as the lean routes read it (LeanRoutes.route_of).
        if scope["type"] == "http" and self._pattern.fullmatch(scope["path"]):
            return Match.PARTIAL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise HTTPException(405, headers={"Allow": ", ".join(self.methods)})


class LeanRoutes:
    """The ASGI app for the lean routes; ``context`` is set when the API starts. ``routes`` are
    tried in their order (the purchase first)."""

    def __init__(
        self, *, routes: Sequence[LeanRoute], max_in_flight: int, max_body_bytes: int
    ) -> None:
        self.context: Context | None = None
        self.routes = tuple(routes)
        self.admission = Admission(max_in_flight)
        self.body_limit = BodyLimit(max_body_bytes)
        self._too_large = Answer(
            413, self.body_limit.refusal, ApiRefusal.BODY_TOO_LARGE, [CONNECTION_CLOSE]
        )
        self._shed = Answer(503, self.admission.refusal, ApiRefusal.OVERLOADED, [RETRY_AFTER])

    def paths(self) -> list[LeanPath]:
        """Each lean route's path, for the framework's router (see ``LeanPath``)."""
        methods: dict[str, list[str]] = {}
        for route in self.routes:
            methods.setdefault(route.template, []).append(route.method)
        return [LeanPath(template, served) for template, served in methods.items()]

    def route_of(self, scope: Scope) -> LeanRoute | None:
        """The lean route that serves this ASGI request, if one does."""
        if scope["type"] != "http":
            return None
        return self.route_for(scope["method"], scope["path"])

    def route_for(self, method: str, path: str) -> LeanRoute | None:
        """The lean route that serves ``method`` on ``path`` (decoded), if one does."""
        for route in self.routes:
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
        if route is LIVEZ:  # liveness asks nothing of the runtime, open or not, nor of the request
            return await livez(self.context, _NOTHING_ASKED)
        ctx = self.context
        if ctx is None:
            raise RuntimeError("a lean route was called before the API started")
        if query_string:  # none of these routes takes one; still, each name once
            check_query_once(query_string)
        item_id = _item_id(route.pattern, path) if route.pattern.groups else 0
        caller = "" if route.caller is None else _caller(ctx, headers, route.caller)
        return await route.decide(ctx, Request(item_id, caller, headers, body, request_id))


async def livez(ctx: Context | None, request: Request) -> Answer:
    """Liveness: 200 while the process serves. No I/O; a store that is down never fails it."""
    return _ALIVE


LIVEZ = LeanRoute(
    method="GET", template=LIVEZ_ROUTE, decide=livez, answer=LiveOut, errors={}, tags=("health",)
)


def header_text(value: bytes | None) -> str | None:
    """A header's value as the framework reads it: Latin-1, so any byte decodes."""
    return None if value is None else value.decode("latin-1")


def _caller(ctx: Context, headers: dict[bytes, bytes], role: Role) -> str:
    token = bearer_token(header_text(headers.get(b"authorization")))
    return authorize(ctx.tokens, token, role).subject


def _answer_to(exc: Exception, route: LeanRoute) -> Answer:
    problem = answer_for(exc)
    if problem is None:
        log.exception("%s %s failed", route.method, route.template)
        problem = ApiError(
            500, ApiRefusal.INTERNAL_ERROR, "the request failed: see the server's log"
        )
    return Answer.error(problem)


def _item_id(pattern: re.Pattern[str], path: str) -> int:
    match = pattern.fullmatch(path)
    text = match.group(1) if match else ""
    if _ITEM_ID.fullmatch(text) and 1 <= int(text) <= MAX_ID:
        return int(text)
    raise ApiError(422, ApiRefusal.INVALID_REQUEST, f"path.item_id: an integer from 1 to {MAX_ID}")
