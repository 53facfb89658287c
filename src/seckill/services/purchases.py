"""Buying: the purchase path, kept free of framework types so the leanest route can serve it."""

from __future__ import annotations

import logging

from seckill.domain.holds import Reservation
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.services.sold_out import SoldOutFlags

log = logging.getLogger(__name__)


class RequestInFlight(Exception):
    """The same (item, buyer, key) is being decided right now in this process."""


class Purchases:
    """One Redis round trip per purchase: the reserve script decides everything at once.

    A repeat of an idempotency key that arrives while the first is still waiting for Redis is
    refused (the IETF Idempotency-Key draft's 409) rather than queued behind it; once the first
    is decided, repeats get its answer from the script. Across processes there is no window to
    guard: the script itself is atomic, so a concurrent repeat elsewhere simply replays.

    The sold-out flag (``sold_out``, see ``seckill.services.sold_out``; none: never flagged):
    a ``sold_out`` answer from the script arms it, and while it stands for an item the script
    is not run. So a stampede on a sold-out item runs the script about once per interval and
    process. A request then costs one GET of its idempotency record: a repeat of a key that
    reserved still gets its first answer (invariant 5), every other request ``sold_out``.
    """

    def __init__(
        self, engine: RedisEngine, order_ids: OrderIds, *, sold_out: SoldOutFlags | None = None
    ) -> None:
        self._engine = engine
        self._order_ids = order_ids
        self._in_flight: set[tuple[int, str, str]] = set()
        self._sold_out = sold_out or SoldOutFlags()

    async def buy(
        self,
        item_id: int,
        *,
        buyer: str,
        quantity: int,
        idempotency_key: str,
        request_id: str = "",
    ) -> Reservation:
        """Decide one purchase. ``request_id`` travels with the ``reserved`` event to the order's
        SQL row, so one id follows the purchase through logs, stream and table."""
        if self._sold_out.answers(item_id, "purchase"):
            # A repeat of a key that reserved still gets its first answer (one GET, no script).
            recorded = await self._engine.recorded(
                item_id, buyer=buyer, quantity=quantity, idempotency_key=idempotency_key
            )
            return recorded or Reservation(Outcome.SOLD_OUT)
        request = (item_id, buyer, idempotency_key)
        if request in self._in_flight:
            raise RequestInFlight(f"a request with idempotency key {idempotency_key!r} is running")
        self._in_flight.add(request)
        try:
            reservation = await self._engine.reserve(
                item_id,
                buyer=buyer,
                quantity=quantity,
                idempotency_key=idempotency_key,
                order_id=self._order_ids.next(),
                request_id=request_id,
            )
        finally:
            self._in_flight.discard(request)
        if reservation.outcome is Outcome.RESERVED and not reservation.replayed:
            # At DEBUG: a line costs 11 us, near a tenth of a purchase's CPU in the server. The
            # request id still joins the order's landing line and its SQL row (the persister's).
            log.debug(
                "order %d reserved: item %d, quantity %d, buyer %s",
                reservation.order_id, item_id, quantity, buyer,
                extra={"item_id": item_id, "order_id": reservation.order_id, "buyer": buyer},
            )  # fmt: skip
        # Only sold_out arms the flag (insufficient_stock says units are left). Other answers do
        # not clear it: one may have been decided before the sold_out that armed it.
        if reservation.outcome is Outcome.SOLD_OUT:
            self._sold_out.arm(item_id)
        return reservation
