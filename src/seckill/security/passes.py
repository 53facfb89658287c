"""Queue passes: what a buyer who joined an item's waiting room shows to learn where they stand.

``POST /api/v1/items/{id}/queue`` answers a pass; the buyer sends it in the ``Seckill-Queue-Pass``
header with each ``GET`` of the queue. Because the pass carries the buyer's position, signed, a
poll is answered without reading the buyer's place from Redis: only the queue's front, which
each API process reads once for every buyer (see ``seckill.services.waiting_room``).

Format (ASCII, at most ``MAX_PASS_LEN`` characters), signed as ``seckill.security.signed``
says, with the ticket secret (the version word keeps a pass from reading as a ticket)::

    q1.<item id>.<buyer>.<position>.<expires at>.<mac>

- ``buyer``: the buyer id as unpadded base64url.
- ``position``: decimal; 0 for a buyer who joined before the start, whose position is drawn at
  the start (the first poll after it answers a new pass that carries it).
- ``expires at``: Unix milliseconds: the sale's end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from seckill.domain.rules import MAX_BUYER_LEN, MAX_ID
from seckill.security.signed import BUYER_FIELD, Signer, decode_buyer, encode_buyer, misbound

PASS_HEADER = "Seckill-Queue-Pass"
VERSION = "q1"
MAX_PASS_LEN = 256

_PAYLOAD = re.compile(
    VERSION + r"\.([1-9][0-9]{0,18})\.(" + BUYER_FIELD + r")\.(0|[1-9][0-9]{0,14})\.([0-9]{1,15})"
)


class BadPass(Exception):
    """The pass is missing, malformed, forged, expired, or for another buyer or item; the
    message says which, safe to show the caller."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePass:
    item_id: int
    buyer: str
    position: int  # 0: drawn at the start
    expires_at_ms: int


class PassCodec:
    """Mints queue passes with one HMAC key and checks them with any of several (a
    rotation's)."""

    def __init__(self, secret: str | bytes | Sequence[str | bytes]) -> None:
        """``secret``: one key, or the keys in order (the first signs)."""
        self._signer = Signer(secret, purpose="queue pass")

    def mint(self, queue_pass: QueuePass) -> str:
        """The pass text. Raises ``ValueError`` for values a check would refuse to read."""
        if not 1 <= queue_pass.item_id <= MAX_ID:
            raise ValueError(f"item id must be from 1 to {MAX_ID}")
        if not 1 <= len(queue_pass.buyer.encode()) <= MAX_BUYER_LEN:
            raise ValueError(f"buyer id must be 1 to {MAX_BUYER_LEN} bytes")
        if not 0 <= queue_pass.position < 10**15 or not 0 <= queue_pass.expires_at_ms < 10**15:
            raise ValueError("position and expires_at_ms must be below 10**15")
        buyer = encode_buyer(queue_pass.buyer)
        fields = (queue_pass.item_id, buyer, queue_pass.position, queue_pass.expires_at_ms)
        return self._signer.sign(".".join((VERSION, *map(str, fields))))

    def check(self, text: str | None, *, item_id: int, buyer: str, now_ms: int) -> QueuePass:
        """The pass, if it is authentic, unexpired at ``now_ms``, and this buyer's for this
        item; ``BadPass`` otherwise (and nothing else)."""
        if not text:
            raise BadPass(f"send the pass from joining the queue in the {PASS_HEADER} header")
        payload = self._signer.opened(text, max_len=MAX_PASS_LEN)
        if payload is None:
            raise BadPass("queue pass signature does not match")
        fields = _PAYLOAD.fullmatch(payload)
        name = None if fields is None else decode_buyer(fields.group(2))
        if fields is None or name is None:
            raise BadPass("malformed queue pass")
        found = QueuePass(
            item_id=int(fields.group(1)),
            buyer=name,
            position=int(fields.group(3)),
            expires_at_ms=int(fields.group(4)),
        )
        problem = misbound(
            "queue pass", buyer=found.buyer, item_id=found.item_id,
            expires_at_ms=found.expires_at_ms, for_buyer=buyer, for_item=item_id, now_ms=now_ms,
            expired="the sale is over",
        )  # fmt: skip
        if problem:
            raise BadPass(problem)
        return found
