"""The JSON answers written straight to ASGI, and the body-size limit, stated once.

The purchase route and the middlewares answer some requests themselves, ahead of the framework
(a shed purchase, a body over the limit, every purchase). They all answer through ``send_json``:
the same headers in the same order, and nothing built per request beyond the two messages, so
the purchase route keeps encoding its common answers once. The rest of the API answers through
FastAPI and ``seckill.api.errors``, in the same ``{"error": code, "message": text}`` shape.

``BodyLimit`` is the 413 rule for both ways in: the purchase route reads its body with it, and
``seckill.api.limits.BodySizeLimit`` holds every other route to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.types import Receive, Send

from seckill.api.request_ids import HEADER as REQUEST_ID_HEADER
from seckill.domain.outcomes import ApiRefusal

Header = tuple[bytes, bytes]
CONTENT_TYPE: Header = (b"content-type", b"application/json")
CONNECTION_CLOSE: Header = (b"connection", b"close")
_CLOSE = (CONNECTION_CLOSE,)


def error_body(code: str, message: str) -> bytes:
    """An error's JSON body: ``{"error": code, "message": message}``."""
    return json.dumps({"error": code, "message": message}).encode()


async def send_json(
    send: Send,
    status: int,
    body: bytes,
    headers: Sequence[Header] = (),
    request_id: str | None = None,
) -> None:
    """Answer with ``body`` (JSON, already encoded) and ``status``: the content type and length,
    then ``X-Request-Id`` if ``request_id`` is given, then ``headers`` (lower-case names).

    Callers behind ``seckill.api.request_ids.RequestIds`` leave ``request_id`` to it."""
    length = (b"content-length", str(len(body)).encode())
    # One list display per answer (no appends, no varargs): this runs on every purchase.
    if request_id is None:
        start = [CONTENT_TYPE, length, *headers]
    else:
        start = [CONTENT_TYPE, length, (REQUEST_ID_HEADER, request_id.encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """A request body went over the limit while it was being read."""


class ClientGone(Exception):
    """The client went away before its request was whole: there is no one to answer."""


class BodyLimit:
    """At most ``max_bytes`` in a request body: refused with 413 ``body_too_large`` as soon as
    it is known to be over (by its Content-Length, or while it streams in), never read whole."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.message = f"request bodies are limited to {max_bytes} bytes"
        self.refusal = error_body(ApiRefusal.BODY_TOO_LARGE, self.message)  # encoded once

    def refuses_length(self, content_length: bytes | None) -> bool:
        """Whether a ``Content-Length`` value (``None`` if absent) is refused as it stands."""
        return content_length is not None and (
            not content_length.isdigit() or int(content_length) > self.max_bytes
        )

    def check(self, received: int) -> None:
        """``BodyTooLarge`` once ``received`` bytes of a body are more than it may have."""
        if received > self.max_bytes:
            raise BodyTooLarge(self.message)

    async def read(self, receive: Receive, content_length: bytes | None) -> bytes:
        """The whole body; ``BodyTooLarge`` as soon as it is known to be over the limit,
        ``ClientGone`` if the client left before sending all of it."""
        if self.refuses_length(content_length):
            raise BodyTooLarge(self.message)
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            body += bytes(message.get("body", b""))
            self.check(len(body))
            if not message.get("more_body", False):
                return body

    async def refuse(self, send: Send) -> None:
        """The 413 answer; the connection is closed, since the rest of the body is not read."""
        await send_json(send, 413, self.refusal, _CLOSE)
