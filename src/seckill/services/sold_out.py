"""The sold-out flag: this process's short memory that Redis answered ``sold_out`` for an item.

A flash sale's crowd keeps coming after the last unit is gone; the flag lets this process answer
it with a dictionary lookup. It is armed only by the reserve script's ``sold_out`` (not by
``insufficient_stock``, which says units are left; with stock shards ``sold_out`` means every
shard was empty), stands for ``recheck_ms`` (0: never armed), and then the next request asks
Redis again, which arms it anew if the item is still sold out. So stock that comes back (a
released hold) is offered again within ``recheck_ms`` of its release: that is the flag's whole
staleness, and every answer given from it may be that stale, never more.

While the flag stands for an item:

* a purchase runs no script, only one GET of its idempotency record, so a repeat of a key that
  reserved keeps its first answer and every other request is ``sold_out`` (``Purchases``);
* a ticket is refused ``sold_out`` with no Redis call at all (``TicketOffice``);
* a buyer's item read shows ``available`` 0 with no read of the counters (``item_on_sale``).

Every answer given from the flag is counted in ``seckill_sold_out_flag_hits_total``, labelled by
the request it answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, get_args

from seckill.observability import metrics

MonotonicClock = Callable[[], float]
"""Seconds from an arbitrary start that never step back (``time.monotonic``)."""

FlaggedRequest = Literal["purchase", "ticket", "item"]
_HITS = {r: metrics.SOLD_OUT_FLAG_HITS.labels(request=r) for r in get_args(FlaggedRequest)}


class SoldOut(Exception):
    """This process knows the item is sold out (its flag stands): no ticket is issued."""


class SoldOutFlags:
    """The flags of one process, one per item, shared by every path that consults them."""

    def __init__(self, recheck_ms: int = 0, *, clock: MonotonicClock = time.monotonic) -> None:
        if recheck_ms < 0:
            raise ValueError("recheck_ms must be at least 0")
        self._recheck_s = recheck_ms / 1000
        self._clock = clock
        self._until: dict[int, float] = {}  # item id -> clock time the flag runs out

    def arm(self, item_id: int) -> None:
        """Redis answered ``sold_out`` for the item: stand for ``recheck_ms`` from now."""
        if self._recheck_s > 0:
            self._until[item_id] = self._clock() + self._recheck_s

    def answers(self, item_id: int, request: FlaggedRequest) -> bool:
        """Whether the flag stands for the item now: if so the caller answers ``request`` as
        sold out without asking Redis, and that answer is counted here."""
        until = self._until.get(item_id)
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[item_id]  # ran out: this request asks Redis again
            return False
        _HITS[request].inc()
        return True
