"""Signed payment provider callbacks: HMAC-SHA256 over the timestamp and the raw body.

One header, ``Seckill-Signature: t=<unix seconds>,v1=<hex digest>``, where the digest is
``HMAC-SHA256(secret, f"{t}.".encode() + body)``. The header may carry several ``v1=`` values
(one per key while the provider rotates keys); any match passes. We may hold several keys too
(``SECKILL_PAYMENT_SECRET``, separated by commas): a digest made with any of them passes, and
``sign`` uses the first. Signing the timestamp with the body and refusing old timestamps stops a
captured callback from being replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence

SIGNATURE_HEADER = "Seckill-Signature"

# ASCII digits only: str.isdigit accepts "²" and friends, which int() then refuses. Twelve digits
# reach the year 33658; anything longer is not a timestamp.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


class BadSignature(Exception):
    """The callback's signature is missing, malformed, stale or wrong: refuse the callback."""


Secret = str | bytes | Sequence[str | bytes]
"""One key, or the keys of a rotation in order: the first signs, every one verifies."""


def sign(secret: Secret, body: bytes, *, timestamp: int) -> str:
    """The full ``Seckill-Signature`` header value for ``body`` signed at ``timestamp`` (with
    the first key)."""
    if timestamp < 0:
        raise ValueError("timestamp must be unix seconds, >= 0")
    return f"t={timestamp},v1={_digest(_keys(secret)[0], timestamp, body)}"


def verify_signature(
    secret: Secret,
    body: bytes,
    header: str | None,
    *,
    now: float,
    tolerance_seconds: int,
) -> int:
    """Check a ``Seckill-Signature`` header against the raw body; return its timestamp.

    Raises ``BadSignature`` (and nothing else, whatever the header holds) when the header is
    missing or malformed, no ``v1`` digest matches the one of any key, or the timestamp is more
    than ``tolerance_seconds`` away from ``now`` in either direction.
    """
    keys = _keys(secret)
    if not header:
        raise BadSignature("missing signature")
    timestamp, candidates = _parse(header)
    # Every candidate is compared with every key's digest, in constant time, so timing tells
    # nothing about which one or how much of it matched.
    matched = False
    for key in keys:
        expected = _digest(key, timestamp, body)
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate.lower())
    if not matched:
        raise BadSignature("signature does not match")
    # Checked after the digest so that only the secret's holder learns about the window.
    if abs(now - timestamp) > tolerance_seconds:
        raise BadSignature(f"signature timestamp outside the {tolerance_seconds} s window")
    return timestamp


def _keys(secret: Secret) -> tuple[bytes, ...]:
    given = (secret,) if isinstance(secret, str | bytes) else tuple(secret)
    keys = tuple(key.encode() if isinstance(key, str) else key for key in given)
    if not keys or not all(keys):
        # An empty key still "signs", and anyone can compute it: a configuration bug, not a key.
        raise ValueError("the signing secret is empty")
    return keys


def _digest(key: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def _parse(header: str) -> tuple[int, list[str]]:
    timestamps: list[str] = []
    digests: list[str] = []
    for part in header.split(","):
        name, equals, value = part.strip().partition("=")
        if not equals:
            raise BadSignature("malformed signature header")
        if name == "t":
            timestamps.append(value)
        elif name == "v1":
            digests.append(value)
        # Other schemes (v0, a future v2) are ignored, so the provider can add one while we
        # still read v1.
    if len(timestamps) != 1 or not _TIMESTAMP.fullmatch(timestamps[0]) or not digests:
        raise BadSignature("malformed signature header")
    # compare_digest refuses non-ASCII str with TypeError: only well-formed digests get there.
    if not all(_DIGEST.fullmatch(digest) for digest in digests):
        raise BadSignature("malformed signature header")
    return int(timestamps[0]), digests
