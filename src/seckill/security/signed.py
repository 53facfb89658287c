"""Signed texts: ``<payload>.<mac>``, where mac is the lowercase hex HMAC-SHA256 of the payload.

Purchase tickets (``seckill.security.tickets``) and queue passes (``seckill.security.passes``)
are such texts, each with its own version word first, so one never reads as the other. Checking
one needs only the keys: no I/O, no state. The MAC is compared in constant time before anything
in the payload is trusted. Several keys may verify while one rotates (see
``seckill.security.generated.secret_keys``); the first signs.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Sequence

from seckill.security.keyed_mac import KeyedMac

# As for HS256 JWTs (RFC 7518 §3.2): a key at least as long as the hash output.
MIN_KEY_BYTES = 32

_MAC = re.compile(r"[0-9a-f]{64}")


class Signer:
    """Signs payloads with one HMAC key and opens texts signed with any of several: the keys of
    a rotation, the signing one first."""

    def __init__(self, secret: str | bytes | Sequence[str | bytes], *, purpose: str) -> None:
        """``secret`` is one key, or the keys in order (the first signs). Raises ``ValueError``
        for none, or for a key shorter than ``MIN_KEY_BYTES``."""
        given = (secret,) if isinstance(secret, str | bytes) else tuple(secret)
        keys = tuple(key.encode() if isinstance(key, str) else key for key in given)
        if not keys:
            raise ValueError(f"the {purpose} secret needs at least one key")
        for number, key in enumerate(keys, start=1):
            if len(key) < MIN_KEY_BYTES:
                which = "" if len(keys) == 1 else f" (key {number} of {len(keys)})"
                raise ValueError(
                    f"the {purpose} secret{which} needs at least {MIN_KEY_BYTES} bytes"
                )
        self._key = KeyedMac(keys[0])
        # Empty with one key: then opening costs what it did before rotation existed.
        self._older = tuple(KeyedMac(key) for key in keys[1:])

    def sign(self, payload: str) -> str:
        return f"{payload}.{self._key.digest(_data(payload)).hex()}"

    def opened(self, text: object, *, max_len: int) -> str | None:
        """The payload of a text signed with any of the keys, or None (whatever ``text``
        holds: never raises)."""
        if not isinstance(text, str) or len(text) > max_len:
            return None
        payload, _, mac = text.rpartition(".")
        # The regex keeps non-ASCII text away from compare_digest, which refuses it (TypeError).
        if not _MAC.fullmatch(mac):
            return None
        # _data inlined: with one key this is all a check costs, as before keys could rotate
        # (tickets are checked on every purchase).
        data = payload.encode("utf-8", "surrogatepass")
        if hmac.compare_digest(mac, self._key.digest(data).hex()):
            return payload
        # Every older key is tried, each in constant time, and a forgery is compared with all of
        # them: how long a refusal takes says nothing about any key. Only an authentic text
        # stops early, which tells its holder no more than it already knows.
        for key in self._older:
            if hmac.compare_digest(mac, key.digest(data).hex()):
                return payload
        return None


def _data(payload: str) -> bytes:
    # surrogatepass: header text is Latin-1 decoded by the server, but a caller may pass any
    # str, lone surrogates included; encoding must not raise.
    return payload.encode("utf-8", "surrogatepass")


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
