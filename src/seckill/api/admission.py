"""Admission: at most ``max_in_flight`` purchases decided at once in this process.

A stampede that outruns Redis (or this process's event loop) only queues: every request waits
longer and all of them time out together. Shedding the excess at once keeps the admitted ones
fast and tells the rest to come back: 503 ``overloaded`` with ``Retry-After: 1``, before the
request is authenticated or its body read, so a shed request costs almost nothing.

Only the purchase route (``POST /api/v1/items/{id}/orders``) is limited. The limit is per
process and in memory: a counter, which needs no lock because the event loop runs one task at a
time and the counter is never read and written across an ``await``. A slot is held from the
moment the request arrives until its answer has been sent.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from seckill.observability import metrics

PURCHASE_PATH = re.compile(r"/api/v1/items/([^/]+)/orders")  # group 1: the item id


class Admission:
    """Counts requests in flight and refuses any beyond ``max_in_flight``."""

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.refusal = json.dumps(
            {
                "error": "overloaded",
                "message": f"more than {max_in_flight} purchases in flight here: retry shortly",
            }
        ).encode()

    def try_enter(self) -> bool:
        """Take a slot if one is free; the caller must ``leave()`` once done with it."""
        if self.in_flight >= self.max_in_flight:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1


class AdmissionLimit:
    """ASGI middleware: purchase requests beyond the limit get 503 ``overloaded`` at once. The
    product's purchase route admits by itself (``seckill.api.purchase_route``); this is for a
    purchase route served through the framework (the benchmarks' SQL baselines)."""

    def __init__(self, app: ASGIApp, *, max_in_flight: int) -> None:
        self.app = app
        self.admission = Admission(max_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and PURCHASE_PATH.fullmatch(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        if not self.admission.try_enter():
            metrics.SHED.inc()
            await self._shed(send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave()

    async def _shed(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(self.admission.refusal)).encode()),
                    (b"retry-after", b"1"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.admission.refusal})
