"""The lean routes answered on the connection itself, without ASGI.

Under uvicorn every connection is this protocol: uvicorn's own HTTP/1.1 protocol (llhttp's
parser, keep-alive, pipelining, timeouts, graceful shutdown), except that a request for one of
``seckill.api.lean_routes`` is answered right here, on the event loop's thread: its headers and
body, once parsed, go straight to ``LeanRoutes.respond``, and the answer is written in one
``transport.write``, with the other answers of the same turn of the event loop (``_Outbox``).
What that skips is the ASGI exchange a request costs otherwise: the scope, the receive and send
messages and the futures behind them. Measured under wrk (64 connections, one process), a
request that reads its body and waits for one Redis reply cost the server 73 µs of CPU through
granian's ASGI and 19 µs on a protocol like this one (docs/benchmarks.md, "The server's
floor").

Anything else goes to the app through uvicorn's ASGI path, unchanged: another route, a path
with an escape (``%``), a request that expects ``100 Continue`` or asks for an upgrade, one
pipelined behind an answer still in flight, and every request of an app with CORS origins (the
lean routes answer behind CORS there, inside the app). Both ways answer with the same status,
headers and body (tests/api/test_lean_http.py holds them to it).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from seckill.api.lean_routes import Answer, LeanRoute, LeanRoutes
from seckill.api.request_ids import HEADER as REQUEST_ID_HEADER
from seckill.api.responses import CONNECTION_CLOSE, CONTENT_TYPE

_CONTENT_TYPE = CONTENT_TYPE[0] + b": " + CONTENT_TYPE[1] + b"\r\ncontent-length: "
_REQUEST_ID = b"\r\n" + REQUEST_ID_HEADER + b": "
_CLOSE = CONNECTION_CLOSE[0] + b": " + CONNECTION_CLOSE[1] + b"\r\n"


class _Settled:
    """What uvicorn's protocol sets when a connection is lost mid-request: nothing to wake."""

    def set(self) -> None:
        pass


_SETTLED = _Settled()


class _Exchange:
    """One lean request on its way: what uvicorn's protocol reads of its ``cycle``
    (``response_complete``, ``keep_alive``, ``disconnected``, ``message_event``) and what the
    route needs."""

    __slots__ = (
        "answering",
        "body",
        "disconnected",
        "headers",
        "keep_alive",
        "lean",
        "message_event",
        "path",
        "query_string",
        "response_complete",
        "route",
    )

    def __init__(
        self,
        lean: LeanRoutes,
        route: LeanRoute,
        path: str,
        query_string: bytes,
        headers: dict[bytes, bytes],
        keep_alive: bool,
    ) -> None:
        self.lean, self.route, self.path, self.query_string = lean, route, path, query_string
        self.headers, self.keep_alive = headers, keep_alive
        self.body = b""
        self.answering = False  # its answer is being made: the rest of the body is not read
        self.response_complete = False
        self.disconnected = False
        self.message_event = _SETTLED


class LeanHttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the lean routes answered on the connection (see the
    module's docstring). Pass the class as uvicorn's ``http`` option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean = _lean_routes(self.app)
        # uvicorn's default headers (the date, the server) as written, for the list they were
        # written from: uvicorn makes a new list when the date changes, once a second.
        self._defaults: tuple[object, bytes] = (None, b"")
        outbox = _OUTBOXES.get(self.loop)
        if outbox is None:
            outbox = _OUTBOXES[self.loop] = _Outbox(self.loop)
        self._outbox = outbox

    def on_headers_complete(self) -> None:
        exchange = self._lean_exchange()
        if exchange is None:
            super().on_headers_complete()
            return
        self.cycle = exchange  # type: ignore[assignment]  # what uvicorn's protocol asks of one
        if exchange.lean.body_limit.refuses_length(exchange.headers.get(b"content-length")):
            self._answer(exchange, None)

    def on_body(self, body: bytes) -> None:
        exchange = self.cycle
        if not isinstance(exchange, _Exchange):
            super().on_body(body)
            return
        if exchange.answering or not exchange.route.takes_body:
            return
        exchange.body += body
        if len(exchange.body) > exchange.lean.body_limit.max_bytes:
            self._answer(exchange, None)  # 413 now, and the connection closed: not read whole

    def on_message_complete(self) -> None:
        exchange = self.cycle
        if not isinstance(exchange, _Exchange):
            super().on_message_complete()
        elif not exchange.answering:
            self._answer(exchange, exchange.body)

    def _lean_exchange(self) -> _Exchange | None:
        """The request as a lean exchange, if a lean route serves it here."""
        lean = self.lean
        if (
            lean is None
            or self.expect_100_continue
            or (self.cycle is not None and not self.cycle.response_complete)  # pipelined
            or self.parser.should_upgrade()
        ):
            return None
        target = self.url
        if target[:1] != b"/" or b"%" in target or b"#" in target:
            return None  # absolute-form, escaped or odd: uvicorn reads those
        raw_path, _, query_string = target.partition(b"?")
        if not raw_path.isascii():
            return None
        path = raw_path.decode("ascii")
        route = lean.route_for(self.parser.get_method().decode("ascii"), path)
        if route is None:
            return None
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        return _Exchange(lean, route, path, query_string, dict(self.headers), keep_alive)

    def _answer(self, exchange: _Exchange, body: bytes | None) -> None:
        exchange.answering = True
        task = self.loop.create_task(self._respond(exchange, body))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _respond(self, exchange: _Exchange, body: bytes | None) -> None:
        answer, request_id = await exchange.lean.respond(
            exchange.route, exchange.path, exchange.query_string, exchange.headers, body
        )
        if not exchange.disconnected:
            self._write(exchange, answer, request_id)

    def _write(self, exchange: _Exchange, answer: Answer, request_id: str) -> None:
        """The answer as uvicorn's ASGI path writes it (its default headers: the date, the
        server; the content type and length, the request id, the answer's own headers), put in
        the outbox."""
        told_to_close = CONNECTION_CLOSE in answer.headers  # a 413: the body was not read
        closes = told_to_close or not exchange.keep_alive
        defaults = self.server_state.default_headers
        if self._defaults[0] is not defaults:
            written = b"".join(name + b": " + value + b"\r\n" for name, value in defaults)
            self._defaults = (defaults, written)
        head = [STATUS_LINE[answer.status], self._defaults[1]]
        head += (_CONTENT_TYPE, b"%d" % len(answer.body), _REQUEST_ID, request_id.encode())
        head.append(b"\r\n")
        for name, value in answer.headers:
            head += (name, b": ", value, b"\r\n")
        if closes and not told_to_close:
            head.append(_CLOSE)
        head += (b"\r\n", answer.body)
        self._outbox.put(self, exchange, b"".join(head), closes)

    def deliver(self, exchange: _Exchange, answer: bytes, closes: bool) -> None:
        """Write an answer the outbox held, and end its exchange as uvicorn ends one."""
        if exchange.disconnected:
            return
        self.transport.write(answer)
        exchange.response_complete = True
        if closes or not exchange.keep_alive:  # not kept alive: HTTP/1.0, or shutting down
            self.transport.close()
        self.on_response_complete()


class _Outbox:
    """The answers of one turn of the event loop, written together at its end.

    Each answer is one write on its own connection either way; what changes is when. Written
    as each is made, tens of microseconds of Python apart, every write found the client asleep
    and paid for waking it: on this 2-vCPU machine, through loopback, the wake-up took 41% of a
    ticket's CPU in the kernel (perf, ``_raw_spin_unlock_irqrestore`` under ``tcp_sendmsg``)
    and 10% of a purchase's. Written back to back, one wake-up serves the turn's answers. An
    answer waits at most for the rest of the turn it was made in."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._held: list[tuple[LeanHttpProtocol, _Exchange, bytes, bool]] = []

    def put(
        self, protocol: LeanHttpProtocol, exchange: _Exchange, answer: bytes, closes: bool
    ) -> None:
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append((protocol, exchange, answer, closes))

    def _flush(self) -> None:
        held, self._held = self._held, []
        for protocol, exchange, answer, closes in held:
            protocol.deliver(exchange, answer, closes)


_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = (
    weakref.WeakKeyDictionary()
)


def _lean_routes(app: Any) -> LeanRoutes | None:
    """The app's lean routes, under whatever uvicorn wrapped it in; None where they must not
    be answered ahead of the app (CORS origins, which the app answers behind)."""
    while app is not None and not hasattr(app, "lean_routes"):
        app = getattr(app, "app", None)
    if app is None or getattr(app, "cors", None) is not None:
        return None
    routes: LeanRoutes = app.lean_routes
    return routes
