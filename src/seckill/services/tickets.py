"""Issuing and checking purchase tickets (the format is in ``seckill.security.tickets``).

A ticket is issued to a buyer for one item from ``lead_ms`` before the sale starts until it
ends, and lives ``ttl_ms``. Issuing reads the item's window from Redis (one script, ``terms``),
and keeps what it read for ``TERMS_FRESH_S``: a crowd asks for its tickets in the same second,
and a read per ticket made a ticket cost what a purchase does. Checking reads nothing at all.
Both use this process's clock: the window and the fence are only a coarse gate here, since the
reserve script decides the real window, and refuses a fenced item, on Redis's side.

Issuing does not read the stock, with one exception: while this process's sold-out flag stands
for the item (a purchase here heard ``sold_out`` from Redis less than ``sold_out_recheck_ms``
ago, see ``seckill.services.sold_out``), a ticket is refused ``SoldOut`` before anything else,
with no Redis call: the crowd that arrives after the last unit costs a dictionary lookup. Else
a ticket is issued whatever is left, and the purchase says ``sold_out``.

In front of issuance stands a ``TicketGate``: the hook for a captcha, a fraud score. The default
admits everyone. An item loaded with a waiting room has the room's gate in front of that one:
which items have one is on the item's head, read by the same one script as the window, so an
item without a room sells directly while another item's room is open. A gate that refuses gives
a ``GateDecision`` with the number of seconds after which the buyer may ask again; the API
answers it with 429 ``gate_refused`` and that ``Retry-After`` (a waiting room says "not yet",
never "no": a buyer it turned away may always come back).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from seckill.domain.items import SaleItem
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.security.tickets import Ticket, TicketCodec
from seckill.services.items import UnknownItem
from seckill.services.orders import ItemRecovering
from seckill.services.sold_out import SoldOut, SoldOutFlags

Clock = Callable[[], int]
"""Epoch milliseconds."""

TERMS_FRESH_S = 0.25  # an item's terms and fence, as read for a ticket, kept this long
_KEPT_TERMS_MAX = 4096  # items whose terms are kept at once (past it, all are read again)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GateDecision:
    """A gate's answer: admitted, or refused with when to ask again and why."""

    admitted: bool
    retry_after_seconds: int = 1
    message: str = "not admitted yet: try again later"

    def __post_init__(self) -> None:
        if self.retry_after_seconds < 1:
            raise ValueError("retry_after_seconds must be at least 1")


ADMITTED = GateDecision(admitted=True, message="admitted")


class TicketGate(Protocol):
    """Decides whether ``buyer`` may have a ticket for ``item_id`` now."""

    async def admit(self, buyer: str, item_id: int) -> GateDecision: ...


class AdmitEveryone:
    """The default gate: no captcha, no waiting room."""

    async def admit(self, buyer: str, item_id: int) -> GateDecision:
        return ADMITTED


class GateRefused(Exception):
    """The gate turned the buyer away, for now."""

    def __init__(self, decision: GateDecision) -> None:
        super().__init__(decision.message)
        self.decision = decision


class SaleClosed(Exception):
    """No tickets for this item now: the sale has not started (more than the lead time away)
    or has ended. ``outcome`` is ``Outcome.NOT_STARTED`` or ``Outcome.ENDED``."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class TicketOffice:
    """Issues tickets through the gate and checks them on the purchase path."""

    def __init__(
        self,
        *,
        engine: RedisEngine,
        codec: TicketCodec,
        gate: TicketGate | None = None,
        waiting_room: TicketGate | None = None,
        sold_out: SoldOutFlags | None = None,
        ttl_ms: int,
        lead_ms: int,
        clock: Clock = wall_clock_ms,
    ) -> None:
        if ttl_ms < 1 or lead_ms < 0:
            raise ValueError("ttl_ms must be at least 1 and lead_ms at least 0")
        self._engine = engine
        self._codec = codec
        self._gate: TicketGate = gate or AdmitEveryone()
        self._waiting_room = waiting_room
        self._sold_out = sold_out or SoldOutFlags()
        self._ttl_ms = ttl_ms
        self._lead_ms = lead_ms
        self._clock = clock
        # item id -> (kept until, on time.monotonic(); the terms; fenced)
        self._kept_terms: dict[int, tuple[float, SaleItem, bool]] = {}

    async def issue(self, item_id: int, *, buyer: str) -> tuple[str, Ticket]:
        """A new ticket (its text, and what it says) for ``buyer`` and ``item_id``.

        Raises ``SoldOut`` while this process's sold-out flag stands for the item (checked
        first, with no Redis call), ``UnknownItem`` when the item is not loaded in Redis,
        ``ItemRecovering`` while it is fenced (its Redis restarted or lost writes: no ticket
        until it is checked), ``SaleClosed`` outside the issuing window, ``GateRefused`` when
        the gate (or, for an item with a waiting room, the room) says not now. The window is
        checked before the gates, so a gate only sees buyers who could buy.
        """
        if self._sold_out.answers(item_id, "ticket"):
            raise SoldOut(f"item {item_id} is sold out")
        item, fenced = await self._terms(item_id)
        if item is None:
            raise UnknownItem(f"item {item_id} is not on sale")
        if fenced:
            raise ItemRecovering(f"item {item_id} is being checked against SQL")
        now = self._clock()
        if now < item.starts_at_ms - self._lead_ms:
            raise SaleClosed(Outcome.NOT_STARTED, "the sale has not started: too early for tickets")
        if now >= item.ends_at_ms:
            raise SaleClosed(Outcome.ENDED, "the sale has ended")
        if item.waiting_room:
            if self._waiting_room is None:
                # Never admit past a room this office cannot consult.
                raise GateRefused(GateDecision(admitted=False, message="no waiting room here"))
            decision = await self._waiting_room.admit(buyer, item_id)
            if not decision.admitted:
                raise GateRefused(decision)
        decision = await self._gate.admit(buyer, item_id)
        if not decision.admitted:
            raise GateRefused(decision)
        ticket = Ticket(item_id=item_id, buyer=buyer, expires_at_ms=now + self._ttl_ms)
        text = self._codec.mint(item_id=item_id, buyer=buyer, expires_at_ms=ticket.expires_at_ms)
        return text, ticket

    async def _terms(self, item_id: int) -> tuple[SaleItem | None, bool]:
        """The item's terms and fence as Redis said them at most ``TERMS_FRESH_S`` ago."""
        now = time.monotonic()
        kept = self._kept_terms.get(item_id)
        if kept is not None and now < kept[0]:
            return kept[1], kept[2]
        item, fenced = await self._engine.terms(item_id)
        if item is not None:  # an item not loaded is asked again: it may be warmed any moment
            if len(self._kept_terms) >= _KEPT_TERMS_MAX:
                self._kept_terms.clear()
            self._kept_terms[item_id] = (now + TERMS_FRESH_S, item, fenced)
        return item, fenced

    def forget(self, item_id: int) -> None:
        """Read the item's terms again at the next ticket (this process just changed them)."""
        self._kept_terms.pop(item_id, None)

    def check(self, text: str | None, *, item_id: int, buyer: str) -> Ticket:
        """The ticket if it lets ``buyer`` buy ``item_id`` now; ``BadTicket`` otherwise. No I/O."""
        return self._codec.check(text, item_id=item_id, buyer=buyer, now_ms=self._clock())
