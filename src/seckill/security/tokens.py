"""API tokens: JWTs naming who calls (``sub``) and as what (``role``).

One algorithm per deployment, pinned: HS256 with a shared secret, or RS256 where only the
issuer holds the private key and the API holds the public one. A token that names any other
algorithm is refused before its signature is looked at, which closes both ``alg: none`` and the
key-confusion attack (an HS256 token "signed" with the RS256 public key).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from joserfc import jwt
from joserfc.errors import BadSignatureError, JoseError, UnsupportedAlgorithmError
from joserfc.jwk import OctKey, RSAKey

from seckill.config import Settings
from seckill.domain.outcomes import InvalidRequest
from seckill.domain.rules import check_buyer
from seckill.security.generated import secret_or_generated

Algorithm = Literal["HS256", "RS256"]

# Tolerated clock difference between the host that minted a token and the host checking it
# (RS256 tokens may come from another service). Small next to any token lifetime.
LEEWAY_SECONDS = 5
# RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
MIN_HMAC_KEY_BYTES = 32
MIN_RSA_KEY_BITS = 2048

# Tokens verified, remembered by a digest of their text: a buyer sends one token with every
# request of a sale (ticket, purchase, retries, order views), and verifying one takes about 27 µs
# where a lookup takes one. Sound because a token's text fixes its claims and the
# codec's key fixes the verdict; only the times are checked again at each use. The key is a
# 128-bit BLAKE2b digest (no two texts share one in practice) and the value one flat tuple
# (subject, role, exp, iat, nbf), so an entry costs about 300 bytes with the dict's share
# (`python -m benchmarks.token_cache`; 450 with the times kept as a dict): 61 MB full. Bounded,
# oldest out first: enough for the buyers of a large sale at once. An entry holds only strings
# and numbers, so the garbage collector stops visiting it after its first pass: a cache of
# objects it had to walk cost every full collection 200,000 visits.
VERIFIED_CACHE_SIZE = 200_000

_REQUIRED_CLAIMS = ("sub", "role", "iss", "aud", "iat", "exp")


class Role(StrEnum):
    """What a token's holder may do."""

    BUYER = "buyer"
    ADMIN = "admin"


_ROLES = {role.value: role for role in Role}


@dataclass(frozen=True, slots=True)
class Identity:
    """The verified caller: who (``subject``) and as what (``role``)."""

    subject: str
    role: Role


class InvalidToken(Exception):
    """The token is refused; the message says why in a few words, safe to show the caller."""


class TokenCodec:
    """Mints and verifies tokens with one pinned algorithm, issuer and audience."""

    def __init__(
        self,
        *,
        algorithm: Algorithm,
        signing_key: str | bytes | None,
        verify_key: str | bytes,
        issuer: str,
        audience: str,
    ) -> None:
        """Keys are an HS256 secret (both the same), or RS256 private and public PEM.

        ``signing_key=None`` makes a codec that can only verify. Raises ``ValueError`` for a
        key that does not fit the algorithm, is too short, or does not pair with the other.
        """
        if not issuer or not audience:
            raise ValueError("issuer and audience must not be empty")
        self.algorithm: Algorithm = algorithm
        self.issuer = issuer
        self.audience = audience
        self._signing_key: OctKey | RSAKey | None
        self._verify_key: OctKey | RSAKey
        if algorithm == "HS256":
            secret = _bytes(verify_key)
            if len(secret) < MIN_HMAC_KEY_BYTES:
                raise ValueError(f"an HS256 secret needs at least {MIN_HMAC_KEY_BYTES} bytes")
            if signing_key is not None and _bytes(signing_key) != secret:
                raise ValueError("HS256 signs and verifies with one secret; these two differ")
            self._verify_key = OctKey.import_key(secret)
            self._signing_key = None if signing_key is None else self._verify_key
        elif algorithm == "RS256":
            public = _rsa_public_key(verify_key)
            self._verify_key = RSAKey.import_key(public)
            self._signing_key = None
            if signing_key is not None:
                private = _rsa_private_key(signing_key)
                if private.public_key().public_numbers() != public.public_numbers():
                    raise ValueError("the RS256 private key does not pair with the public key")
                self._signing_key = RSAKey.import_key(private)
        else:
            raise ValueError(f"unsupported algorithm {algorithm!r}; use HS256 or RS256")
        self._verified: dict[bytes, tuple[str, str, Any, Any, Any]] = {}

    @property
    def can_mint(self) -> bool:
        """Whether this codec holds a signing key."""
        return self._signing_key is not None

    def mint(self, subject: str, role: Role, *, ttl_seconds: int, now: float | None = None) -> str:
        """A token for ``subject`` as ``role``, valid for ``ttl_seconds`` from ``now``.

        Raises ``ValueError`` for a subject ``verify`` would refuse, and when the codec has no
        signing key.
        """
        if self._signing_key is None:
            if self.algorithm == "RS256":
                raise ValueError(
                    "this codec only verifies tokens: minting RS256 tokens needs the private "
                    "key (set SECKILL_JWT_PRIVATE_KEY_FILE)"
                )
            raise ValueError("this codec only verifies tokens: it has no signing key")
        if ttl_seconds < 1:
            raise ValueError("ttl_seconds must be at least 1")
        role = Role(role)
        problem = _subject_problem(subject, role)
        if problem:
            raise ValueError(f"cannot mint a token: {problem}")
        issued = int(time.time() if now is None else now)
        claims = {
            "sub": subject,
            "role": role.value,
            "iss": self.issuer,
            "aud": self.audience,
            "iat": issued,
            "exp": issued + ttl_seconds,
        }
        return jwt.encode({"alg": self.algorithm, "typ": "JWT"}, claims, self._signing_key)

    def verify(self, token: str, *, now: float | None = None) -> Identity:
        """The identity a valid token names; ``InvalidToken`` for anything else."""
        now = time.time() if now is None else now
        digest = hashlib.blake2b(token.encode(errors="surrogatepass"), digest_size=16).digest()
        known = self._verified.get(digest)
        if known is not None:
            subject, role, exp, iat, nbf = known
            _check_times(exp, iat, nbf, now)
            return Identity(subject=subject, role=_ROLES[role])
        identity, times = self._verify_signed(token, now)
        if len(self._verified) >= VERIFIED_CACHE_SIZE:
            del self._verified[next(iter(self._verified))]
        self._verified[digest] = (identity.subject, identity.role.value, *times)
        return identity

    def _verify_signed(self, token: str, now: float) -> tuple[Identity, tuple[Any, Any, Any]]:
        try:
            # Only the pinned algorithm is allowed: a token naming another (none, or HS256
            # against an RS256 key) is refused before its signature is looked at.
            claims = jwt.decode(token, self._verify_key, algorithms=[self.algorithm]).claims
        except UnsupportedAlgorithmError:
            raise InvalidToken(f"token is not signed with {self.algorithm}") from None
        except BadSignatureError:
            raise InvalidToken("token signature does not match") from None
        except (JoseError, ValueError, TypeError):
            raise InvalidToken("malformed token") from None
        for claim in _REQUIRED_CLAIMS:
            if claims.get(claim) is None:
                raise InvalidToken(f"token has no {claim} claim")
        if claims["iss"] != self.issuer:
            raise InvalidToken("wrong issuer")
        audience = claims["aud"]
        if not (
            audience == self.audience or (isinstance(audience, list) and self.audience in audience)
        ):
            raise InvalidToken("wrong audience")
        if not isinstance(claims["sub"], str):
            raise InvalidToken("token subject must be a string")
        times = (claims["exp"], claims["iat"], claims.get("nbf"))
        _check_times(*times, now)
        try:
            role = Role(claims["role"])
        except (ValueError, TypeError):
            raise InvalidToken("unknown role") from None
        subject = claims["sub"]
        problem = _subject_problem(subject, role)
        if problem:
            raise InvalidToken(f"bad subject: {problem}")
        return Identity(subject=subject, role=role), times


def token_codec(settings: Settings) -> TokenCodec:
    """The codec the settings describe (HS256 secret generated into the data dir if unset)."""
    if settings.jwt_algorithm == "HS256":
        secret = secret_or_generated(settings, "jwt")
        return TokenCodec(
            algorithm="HS256",
            signing_key=secret,
            verify_key=secret,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
        )
    if settings.jwt_public_key_file is None:
        raise ValueError("RS256 needs SECKILL_JWT_PUBLIC_KEY_FILE (a PEM public key)")
    private_file = settings.jwt_private_key_file
    return TokenCodec(
        algorithm="RS256",
        signing_key=None if private_file is None else private_file.read_bytes(),
        verify_key=settings.jwt_public_key_file.read_bytes(),
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
    )


def _subject_problem(subject: Any, role: Role) -> str | None:
    if role is Role.BUYER:
        # The subject becomes the buyer id in Redis keys and SQL rows: the same rule as there.
        try:
            check_buyer(subject)
        except InvalidRequest as error:
            return error.message
        return None
    if not isinstance(subject, str) or not subject or not subject.isprintable():
        # It ends up in logs and audit rows: no empty names, no control characters.
        return "admin subject must be a non-empty printable string"
    return None


def _check_times(exp: Any, iat: Any, nbf: Any, now: float) -> None:
    if not (_is_time(exp) and _is_time(iat)):
        raise InvalidToken("token times must be numbers")
    if exp <= now - LEEWAY_SECONDS:
        raise InvalidToken("token expired")
    if iat > now + LEEWAY_SECONDS:
        raise InvalidToken("token issued in the future")
    if nbf is not None and (not _is_time(nbf) or nbf > now + LEEWAY_SECONDS):
        raise InvalidToken("token not valid yet")


def _is_time(value: Any) -> bool:
    # bool is an int subclass; json reads 1e400 as inf (ints of any size compare fine).
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def _rsa_public_key(pem: str | bytes) -> RSAPublicKey:
    try:
        key = load_pem_public_key(_bytes(pem))
    except ValueError as error:
        raise ValueError(f"the RS256 verify key is not a PEM public key: {error}") from None
    if not isinstance(key, RSAPublicKey):
        raise ValueError("the RS256 verify key is not an RSA key")
    if key.key_size < MIN_RSA_KEY_BITS:
        raise ValueError(f"an RS256 key needs at least {MIN_RSA_KEY_BITS} bits")
    return key


def _rsa_private_key(pem: str | bytes) -> RSAPrivateKey:
    try:
        key = load_pem_private_key(_bytes(pem), password=None)
    except (ValueError, TypeError) as error:
        # TypeError: the PEM is encrypted; we take no passphrase.
        raise ValueError(f"the RS256 signing key is not an unencrypted PEM key: {error}") from None
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("the RS256 signing key is not an RSA key")
    return key
