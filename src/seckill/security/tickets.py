"""Purchase tickets: short-lived, signed permits to buy one item as one buyer.

A buyer asks for a ticket (``POST /api/v1/items/{id}/tickets``) and sends it with each purchase
in the ``Seckill-Ticket`` header. The purchase path is then hidden behind a value that only the
API can mint, that names its buyer and item, and that dies within seconds: a bot cannot script
purchases ahead of the sale, nor share one ticket between accounts or items, and the place to
put a captcha or a waiting room is the one request that issues tickets.

Format (ASCII, at most ``MAX_TICKET_LEN`` characters)::

    v1.<item id>.<buyer>.<expires at>.<mac>

- ``item id``: decimal, no leading zeros.
- ``buyer``: the buyer id as unpadded base64url (buyer ids may contain dots).
- ``expires at``: Unix time in milliseconds, decimal; the ticket is valid while now < it.
- ``mac``: lowercase hex HMAC-SHA256, keyed with the ticket secret's first key, of everything
  before the last dot (``v1.<item id>.<buyer>.<expires at>``).

Checking a ticket needs only the keys (any of ``SECKILL_TICKET_SECRET``'s; see
docs/operations/keys.md): no Redis round trip, no state (see
``seckill.security.signed``). A ticket is not spent by a purchase: it may be sent
with several attempts (retries, a larger quantity after a refusal) until it expires; the
``Idempotency-Key`` still makes each purchase happen once. Expiry is read from the checking
process's clock: API hosts whose clocks differ shift a ticket's life by that difference, which
NTP keeps far below a ticket's lifetime.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from seckill.domain.rules import MAX_BUYER_LEN, MAX_ID
from seckill.security.signed import (
    BUYER_FIELD,
    Signer,
    decode_buyer,
    encode_buyer,
    misbound,
)

TICKET_HEADER = "Seckill-Ticket"
VERSION = "v1"
# The longest well-formed ticket is about 190 characters (a 64-character buyer); anything much
# longer is refused before any work is done on it.
MAX_TICKET_LEN = 256

# What a ticket says, checked in one match: version, item id, buyer, expiry.
_PAYLOAD = re.compile(VERSION + r"\.([1-9][0-9]{0,18})\.(" + BUYER_FIELD + r")\.([0-9]{1,15})")


class BadTicket(Exception):
    """The ticket is missing, malformed, forged, expired, or for another buyer or item. The
    message says which in a few words, safe to show the caller."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """What a valid ticket says."""

    item_id: int
    buyer: str
    expires_at_ms: int


class TicketCodec:
    """Mints tickets with one HMAC key and checks them with any of several (a rotation's)."""

    def __init__(self, secret: str | bytes | Sequence[str | bytes]) -> None:
        """``secret``: one key, or the keys in order (the first signs). Raises ``ValueError``
        for a key shorter than ``signed.MIN_KEY_BYTES``."""
        self._signer = Signer(secret, purpose="ticket")

    def mint(self, *, item_id: int, buyer: str, expires_at_ms: int) -> str:
        """The ticket text. Raises ``ValueError`` for values a check would refuse to read."""
        if isinstance(item_id, bool) or not 1 <= item_id <= MAX_ID:
            raise ValueError(f"item id must be from 1 to {MAX_ID}")
        if not 1 <= len(buyer.encode()) <= MAX_BUYER_LEN:
            raise ValueError(f"buyer id must be 1 to {MAX_BUYER_LEN} bytes")
        if not 0 <= expires_at_ms < 10**15:
            raise ValueError("expires_at_ms must be Unix milliseconds")
        return self._signer.sign(f"{VERSION}.{item_id}.{encode_buyer(buyer)}.{expires_at_ms}")

    def read(self, text: str | None) -> Ticket:
        """What an authentic ticket says, expired or not. ``BadTicket`` for anything else, and
        nothing else is ever raised, whatever ``text`` holds."""
        if not text:
            raise BadTicket(f"a purchase needs a ticket in the {TICKET_HEADER} header")
        if not isinstance(text, str) or len(text) > MAX_TICKET_LEN:
            raise BadTicket("malformed ticket")
        payload = self._signer.opened(text, max_len=MAX_TICKET_LEN)
        if payload is None:
            raise BadTicket("ticket signature does not match")
        # Authentic, so this holds unless the key signed something else; checked all the same.
        fields = _PAYLOAD.fullmatch(payload)
        name = None if fields is None else decode_buyer(fields.group(2))
        if fields is None or name is None:
            raise BadTicket("malformed ticket")
        return Ticket(item_id=int(fields.group(1)), buyer=name, expires_at_ms=int(fields.group(3)))

    def check(self, text: str | None, *, item_id: int, buyer: str, now_ms: int) -> Ticket:
        """The ticket, if it is authentic, unexpired at ``now_ms``, and for this buyer and
        item; ``BadTicket`` otherwise (and nothing else)."""
        ticket = self.read(text)
        problem = misbound(
            "ticket", buyer=ticket.buyer, item_id=ticket.item_id,
            expires_at_ms=ticket.expires_at_ms, for_buyer=buyer, for_item=item_id, now_ms=now_ms,
            expired="ask for a new one",
        )  # fmt: skip
        if problem:
            raise BadTicket(problem)
        return ticket
