"""Signed texts: ``<payload>.<mac>``, where mac is the lowercase hex HMAC-SHA256 of the payload.

Purchase tickets (``seckill.security.tickets``) and queue passes (``seckill.security.passes``)
are such texts, each with its own version word first, so one never reads as the other. Checking
one needs only the key: no I/O, no state. The MAC is compared in constant time before anything
in the payload is trusted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re

# As for HS256 JWTs (RFC 7518 §3.2): a key at least as long as the hash output.
MIN_KEY_BYTES = 32

_MAC = re.compile(r"[0-9a-f]{64}")


class Signer:
    """Signs payloads and opens signed texts with one HMAC key."""

    def __init__(self, secret: str | bytes, *, purpose: str) -> None:
        """Raises ``ValueError`` for a key shorter than ``MIN_KEY_BYTES``."""
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the {purpose} secret needs at least {MIN_KEY_BYTES} bytes")
        self._key = key

    def sign(self, payload: str) -> str:
        return f"{payload}.{self._mac(payload)}"

    def opened(self, text: object, *, max_len: int) -> str | None:
        """The payload of an authentic text, or None (whatever ``text`` holds: never raises)."""
        if not isinstance(text, str) or len(text) > max_len:
            return None
        payload, _, mac = text.rpartition(".")
        # The regex keeps non-ASCII text away from compare_digest, which refuses it (TypeError).
        if not _MAC.fullmatch(mac) or not hmac.compare_digest(mac, self._mac(payload)):
            return None
        return payload

    def _mac(self, payload: str) -> str:
        # surrogatepass: header text is Latin-1 decoded by the server, but a caller may pass any
        # str, lone surrogates included; encoding must not raise.
        data = payload.encode("utf-8", "surrogatepass")
        return hmac.digest(self._key, data, hashlib.sha256).hex()  # the one-shot C path


def misbound(
    what: str, *, buyer: str, item_id: int, expires_at_ms: int, for_buyer: str, for_item: int,
    now_ms: int, expired: str,
) -> str | None:  # fmt: skip
    """Why an authentic ``what`` (a ticket, a queue pass) does not let ``for_buyer`` act on
    ``for_item`` at ``now_ms``, in words safe to show the caller; None when it does."""
    if buyer != for_buyer:
        return f"the {what} is for another buyer"
    if item_id != for_item:
        return f"the {what} is for another item"
    if now_ms >= expires_at_ms:
        return f"the {what} has expired: {expired}"
    return None


BUYER_FIELD = r"[A-Za-z0-9_-]{2,88}"
"""A buyer id inside a signed payload, as ``encode_buyer`` writes it (buyer ids may hold dots)."""


def encode_buyer(buyer: str) -> str:
    """The buyer id as unpadded base64url."""
    return base64.urlsafe_b64encode(buyer.encode()).rstrip(b"=").decode()


def decode_buyer(field: str) -> str | None:
    """The buyer id ``encode_buyer`` wrote, or None."""
    try:
        return base64.urlsafe_b64decode(field + "=" * (-len(field) % 4)).decode()
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
