"""Admission: at most ``max_in_flight`` purchases decided at once in this process.

A stampede that outruns Redis (or this process's event loop) only queues: every request waits
longer and all of them time out together. Shedding the excess at once keeps the admitted ones
fast and tells the rest to come back: 503 ``overloaded`` with ``Retry-After: 1``, before the
request is authenticated or its body read, so a shed request costs almost nothing.

Only the purchase route (``seckill.api.lean_routes``) is limited; it admits by itself. The
limit is per process and in memory: a counter, which needs no lock because the event loop runs
one task at a time and the counter is never read and written across an ``await``. A slot is held
from the moment the request arrives until its answer has been sent.
"""

from __future__ import annotations

from seckill.api.responses import Header, error_body
from seckill.domain.outcomes import ApiRefusal

RETRY_AFTER: Header = (b"retry-after", b"1")
"""Sent with every shed request: come back in a second."""


class Admission:
    """Counts requests in flight and refuses any beyond ``max_in_flight``."""

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.refusal = error_body(
            ApiRefusal.OVERLOADED,
            f"more than {max_in_flight} purchases in flight here: retry shortly",
        )

    def try_enter(self) -> bool:
        """Take a slot if one is free; the caller must ``leave()`` once done with it."""
        if self.in_flight >= self.max_in_flight:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
