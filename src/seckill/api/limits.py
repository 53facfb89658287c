"""Request bodies larger than the configured limit are refused with 413 before they are read
whole: by their Content-Length, or while streaming when they come chunked. The rule and its
answer are ``seckill.api.responses.BodyLimit``, which the purchase route applies by itself."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seckill.api.responses import BodyLimit, BodyTooLarge


class BodySizeLimit:
    """ASGI middleware holding every request that passes through it to ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.limit = BodyLimit(max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and self.limit.refuses_length(value):
                await self.limit.refuse(send)
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                self.limit.check(received)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self.limit.refuse(send)
