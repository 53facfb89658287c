"""Every request gets an id: the caller's ``X-Request-Id`` if usable, else a new one. It is
answered in the same header and logged with everything the request does
(``seckill.observability.logs``)."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seckill.observability.logs import REQUEST_ID, new_request_id

HEADER = b"x-request-id"
_USABLE = re.compile(rb"[A-Za-z0-9._:-]{1,64}")  # safe in a log line, a header and a Lua ARGV


def request_id_from(given: bytes) -> str:
    """The request's id: the caller's ``X-Request-Id`` value if usable, else a new one."""
    return given.decode() if _USABLE.fullmatch(given) else new_request_id()


class RequestIds:
    """Pure ASGI middleware, so it costs a header lookup and a context variable per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(next((v for k, v in scope["headers"] if k == HEADER), b""))

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (HEADER, request_id.encode())]
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, answer)
        finally:
            REQUEST_ID.reset(token)
