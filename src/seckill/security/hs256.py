"""HS256 tokens verified the short way, for the header nearly every token has.

A crowd's first purchase verifies a token nobody has seen, and through the general JOSE path
(joserfc: registries, header objects, key objects) that costs about 27 µs, where the work
itself, one HMAC-SHA256 and two small base64 and JSON reads, takes a few. ``Hs256Verifier``
does only that work (the HMAC keyed once: ``KeyedMac``), for the tokens it can judge with
certainty: a compact JWS whose header is ``{"alg": "HS256"}`` with at most ``"typ": "JWT"``
beside it, a 32-byte signature, and the whole token within the general path's size limits.
For those it decodes as the general path does (joserfc's strict base64url, the standard
library's JSON) and accepts exactly what it accepts: a signature one of the secrets made, over
a payload that is a JSON object. Anything else (another header, a bad signature, a malformed
part) it leaves to the general path, which refuses it and says why, so a refusal reads the
same either way. The claims are checked after both, in one place
(``TokenCodec._verify_signed``). tests/unit/test_hs256.py holds the two paths to the same
verdicts on hostile tokens.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Sequence
from typing import Any

from seckill.security.keyed_mac import KeyedMac

_MAX_TOKEN_CHARS = 1024  # well inside joserfc's size limits (header 512, payload 128,000)
_SIGNATURE_CHARS = 43  # 32 bytes, base64url without padding
_PLAIN_HEADER_KEYS = frozenset({"alg", "typ"})
_KNOWN_HEADERS = 64  # distinct header segments remembered: in practice one or two
_BASE64URL = re.compile(rb"[A-Za-z0-9_-]*")
_TO_BASE64 = bytes.maketrans(b"-_", b"+/")
# The last character of a segment whose bits end mid-byte: those leave the spare bits 0 (RFC
# 4648's canonical form), as joserfc requires; by padding length 1 and 2.
_CANONICAL_ENDS = (b"AEIMQUYcgkosw048", b"AQgw")


class Hs256Verifier:
    """The claims of HS256 tokens signed by one of ``secrets`` (any of them verifies, as
    while a secret rotates), for the plain header; None where the general path must judge."""

    def __init__(self, secrets: Sequence[bytes]) -> None:
        self._macs = tuple(KeyedMac(secret) for secret in secrets)
        self._plain_headers: dict[bytes, bool] = {}

    def claims(self, token: str) -> dict[str, Any] | None:
        """The verified claims, or None: not a token this path judges, or not a valid one."""
        if len(token) > _MAX_TOKEN_CHARS or not token.isascii():
            return None
        raw = token.encode()
        parts = raw.split(b".")
        if len(parts) != 3:
            return None
        header, payload, signature = parts
        if len(signature) != _SIGNATURE_CHARS or not self._plain(header):
            return None
        signed = raw[: len(header) + 1 + len(payload)]
        for mac in self._macs:
            # Compared as text: ours is canonical base64url, so a segment that is not (which
            # the general path refuses) never matches.
            if hmac.compare_digest(base64.urlsafe_b64encode(mac.digest(signed))[:-1], signature):
                break
        else:
            return None
        body = _base64url(payload)
        if body is None:
            return None
        try:
            claims = json.loads(body)  # bytes, as the general path reads them
        except ValueError:  # UnicodeDecodeError too
            return None
        return claims if isinstance(claims, dict) else None

    def _plain(self, header: bytes) -> bool:
        known = self._plain_headers.get(header)
        if known is None:
            known = _is_plain(header)
            if len(self._plain_headers) < _KNOWN_HEADERS:
                self._plain_headers[header] = known
        return known


def _base64url(segment: bytes) -> bytes | None:
    """A segment decoded by joserfc's rules (base64url, no padding, canonical end), or None
    where those refuse it."""
    pad = -len(segment) % 4
    if pad == 3 or not _BASE64URL.fullmatch(segment):
        return None
    if pad and segment[-1] not in _CANONICAL_ENDS[pad - 1]:
        return None
    return binascii.a2b_base64(segment.translate(_TO_BASE64) + b"=" * pad)


def _is_plain(header: bytes) -> bool:
    """Whether a header segment is ``{"alg": "HS256"}``, perhaps with ``"typ": "JWT"``."""
    decoded = _base64url(header)
    if decoded is None:
        return False
    try:
        fields = json.loads(decoded)
    except ValueError:
        return False
    return (
        isinstance(fields, dict)
        and fields.keys() <= _PLAIN_HEADER_KEYS
        and fields.get("alg") == "HS256"
        and fields.get("typ", "JWT") == "JWT"
    )
