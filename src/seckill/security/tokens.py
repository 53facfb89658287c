"""API tokens: JWTs naming who calls (``sub``) and as what (``role``).

Every key is pinned to one algorithm. Either one algorithm per deployment: HS256 with shared
secrets (several while one rotates: the first signs, any verifies), or RS256 / ES256 where only
the issuer holds the private key and the API holds the public one. Or a JSON Web Key Set
(``seckill.security.jwks``): each token names its key by ``kid`` and must use the algorithm that
key is pinned to. A token that names any other algorithm is refused before its signature is
looked at, which closes both ``alg: none`` and the key-confusion attack (an HS256 token "signed"
with an RS256 public key).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ec import (
    EllipticCurvePrivateKey,
    EllipticCurvePublicKey,
)
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from joserfc import jwt
from joserfc.errors import BadSignatureError, JoseError, UnsupportedAlgorithmError
from joserfc.jwk import ECKey, GuestProtocol, OctKey, RSAKey

from seckill.domain.configuration import variable
from seckill.domain.outcomes import InvalidRequest
from seckill.domain.rules import check_buyer
from seckill.security.hs256 import Hs256Verifier
from seckill.security.jwks import (
    ALGORITHMS,
    MIN_HMAC_KEY_BYTES,
    MIN_RSA_KEY_BITS,
    Algorithm,
    KeyTable,
    PinnedKey,
    fingerprint,
    key_problem,
    quiet_key_sizes,
)

__all__ = [
    "LEEWAY_SECONDS",
    "MIN_HMAC_KEY_BYTES",
    "MIN_RSA_KEY_BITS",
    "VERIFIED_CACHE_SIZE",
    "Algorithm",
    "Identity",
    "InvalidToken",
    "Role",
    "TokenCodec",
]

# Tolerated clock difference between the host that minted a token and the host checking it
# (RS256 tokens may come from another service). Small next to any token lifetime.
LEEWAY_SECONDS = 5

# Tokens verified, remembered by a digest of their text: a buyer sends one token with every
# request of a sale (ticket, purchase, retries, order views), and verifying one takes about 27 µs
# where a lookup takes one. Sound because a token's text fixes its claims and the
# codec's keys fix the verdict (a codec whose key set changes forgets every entry); only the
# times are checked again at each use. The key is a
# 128-bit BLAKE2b digest (no two texts share one in practice) and the value one flat tuple
# (subject, role, exp, iat, nbf), so an entry costs about 300 bytes with the dict's share
# (`python -m benchmarks.token_cache`; 450 with the times kept as a dict): 61 MB full. Bounded,
# oldest out first: enough for the buyers of a large sale at once. An entry holds only strings
# and numbers, so the garbage collector stops visiting it after its first pass: a cache of
# objects it had to walk cost every full collection 200,000 visits.
VERIFIED_CACHE_SIZE = 200_000

_REQUIRED_CLAIMS = ("sub", "role", "iss", "aud", "iat", "exp")
_PRIVATE_KEY_FILE = variable("jwt_private_key_file")
_SIGNING_KID = variable("jwt_signing_kid")

_Key = OctKey | RSAKey | ECKey


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
    """Mints and verifies tokens for one issuer and audience, each key pinned to one
    algorithm: one algorithm for all (the constructor) or a key set (``from_key_set``)."""

    algorithm: Algorithm | None
    # One pinned algorithm: its keys, the signing one first. Empty with a key set.
    _pinned: tuple[_Key, ...]
    _key_set: dict[str, PinnedKey] | None
    _fingerprint: frozenset[tuple[str, str, str]]
    _signing: tuple[_Key, dict[str, str]] | None
    _hs256: Hs256Verifier | None  # the short way to verify, for one pinned HS256
    # Oldest first. An OrderedDict drops its oldest in O(1); a dict's first key is found past
    # every slot freed before it (a crowd of new buyers made the refusal 3x dearer that way).
    _verified: OrderedDict[bytes, tuple[str, str, Any, Any, Any]]

    def __init__(
        self,
        *,
        algorithm: Algorithm,
        signing_key: str | bytes | None,
        verify_key: str | bytes | Sequence[str | bytes],
        issuer: str,
        audience: str,
    ) -> None:
        """Keys are HS256 secrets (the signing one among those that verify: one, or several
        while one rotates, in order), or RS256 / ES256 private and public PEM.

        ``signing_key=None`` makes a codec that can only verify. Raises ``ValueError`` for a
        key that does not fit the algorithm, is too short, or does not pair with the other.
        """
        self._start(issuer, audience)
        self.algorithm = algorithm
        if algorithm == "HS256":
            given = (verify_key,) if isinstance(verify_key, str | bytes) else tuple(verify_key)
            secrets = [_bytes(key) for key in given]
            if not secrets:
                raise ValueError("HS256 needs at least one secret")
            if any(len(secret) < MIN_HMAC_KEY_BYTES for secret in secrets):
                raise ValueError(f"an HS256 secret needs at least {MIN_HMAC_KEY_BYTES} bytes")
            if signing_key is not None and _bytes(signing_key) not in secrets:
                raise ValueError(
                    "HS256 signs with one of the secrets that verify; the signing secret "
                    "differs from each of them"
                )
            self._pinned = tuple(OctKey.import_key(secret) for secret in secrets)
            self._hs256 = Hs256Verifier(secrets)
            if signing_key is not None:
                self._signing = (OctKey.import_key(_bytes(signing_key)), {"alg": algorithm})
        elif algorithm in ("RS256", "ES256"):
            if not isinstance(verify_key, str | bytes):
                raise ValueError(f"{algorithm} verifies with one PEM public key")
            public = _public_key(verify_key, algorithm)
            self._pinned = (public,)
            if signing_key is not None:
                private = _private_key(signing_key, algorithm)
                if not _pairs(private, public):
                    raise ValueError(
                        f"the {algorithm} private key does not pair with the public key"
                    )
                self._signing = (private, {"alg": algorithm})
        else:
            raise ValueError(
                f"unsupported algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}"
            )

    @classmethod
    def from_key_set(
        cls,
        key_set: KeyTable,
        *,
        signing_kid: str | None = None,
        signing_key: str | bytes | None = None,
        issuer: str,
        audience: str,
    ) -> TokenCodec:
        """A codec that verifies tokens with the key each names by ``kid`` in ``key_set``,
        which may be replaced later (``use_keys``).

        To mint, ``signing_kid`` names the key tokens are signed under: an HS256 key of the set,
        or (``signing_key``) the PEM private key of an RS256 or ES256 one. Without it the codec
        only verifies. Raises ``ValueError`` for a kid not in the set, or a private key that
        does not pair with the public one published under that kid.
        """
        codec = cls.__new__(cls)
        codec._start(issuer, audience)
        codec.algorithm = None
        codec._key_set = dict(key_set)
        codec._fingerprint = fingerprint(key_set)
        if signing_kid is None:
            if signing_key is not None:
                raise ValueError(
                    f"a private key signs under the kid it is published as: set {_SIGNING_KID}"
                )
            return codec
        pinned = key_set.get(signing_kid)
        if pinned is None:
            raise ValueError(f"{_SIGNING_KID} names {signing_kid!r}, which is not in the key set")
        header = {"alg": pinned.alg, "kid": signing_kid}
        if signing_key is not None:
            if pinned.alg == "HS256":
                raise ValueError(
                    f"{signing_kid!r} is an HS256 key of the set, which signs itself: "
                    f"{_PRIVATE_KEY_FILE} is for RS256 and ES256 keys"
                )
            private = _private_key(signing_key, pinned.alg)
            if not _pairs(private, pinned.key):
                raise ValueError(
                    f"the private key does not pair with the key published as {signing_kid!r}"
                )
            codec._signing = (private, header)
        elif pinned.alg == "HS256":
            codec._signing = (pinned.key, header)
        else:
            raise ValueError(
                f"minting {pinned.alg} tokens under {signing_kid!r} needs its private key: "
                f"set {_PRIVATE_KEY_FILE}"
            )
        return codec

    def _start(self, issuer: str, audience: str) -> None:
        if not issuer or not audience:
            raise ValueError("issuer and audience must not be empty")
        self.issuer = issuer
        self.audience = audience
        self._pinned = ()
        self._key_set = None
        self._fingerprint = frozenset()
        self._signing = None
        self._hs256 = None
        self._verified = OrderedDict()
        # Called when a token names a kid the key set lacks (the refresher loads it early).
        self.on_unknown_key: Callable[[], None] | None = None

    @property
    def can_mint(self) -> bool:
        """Whether this codec holds a signing key."""
        return self._signing is not None

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The kids of the key set, in its order; empty for one pinned algorithm."""
        return () if self._key_set is None else tuple(self._key_set)

    def use_keys(self, key_set: KeyTable) -> bool:
        """Verify with ``key_set`` from now on; True if it differs from the set in use. Tokens
        verified before are checked again, so a key removed from the set verifies nothing
        more. Only for a codec made ``from_key_set``."""
        if self._key_set is None:
            raise ValueError("this codec verifies with one pinned algorithm, not a key set")
        found = fingerprint(key_set)
        if found == self._fingerprint:
            return False
        self._key_set = dict(key_set)
        self._fingerprint = found
        self._verified = OrderedDict()
        return True

    def mint(self, subject: str, role: Role, *, ttl_seconds: int, now: float | None = None) -> str:
        """A token for ``subject`` as ``role``, valid for ``ttl_seconds`` from ``now``.

        Raises ``ValueError`` for a subject ``verify`` would refuse, and when the codec has no
        signing key.
        """
        if self._signing is None:
            if self._key_set is not None:
                raise ValueError(
                    "this codec only verifies tokens: minting with a key set needs the kid to "
                    f"sign under ({_SIGNING_KID})"
                )
            if self.algorithm != "HS256":
                raise ValueError(
                    f"this codec only verifies tokens: minting {self.algorithm} tokens needs "
                    f"the private key (set {_PRIVATE_KEY_FILE})"
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
        key, header = self._signing
        return jwt.encode({**header, "typ": "JWT"}, claims, key)

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
            self._verified.popitem(last=False)
        self._verified[digest] = (identity.subject, identity.role.value, *times)
        return identity

    def _claims(self, token: str) -> dict[str, Any]:
        if self._hs256 is not None:
            claims = self._hs256.claims(token)
            if claims is not None:
                return claims  # else the general path below judges it, and says why
        if self._key_set is not None:
            # Only the algorithms a key may be pinned to pass the header check; _key_for then
            # holds the token to its key's one.
            return jwt.decode(token, self._key_for, algorithms=ALGORITHMS).claims
        # Only the pinned algorithm is allowed: a token naming another (none, or HS256
        # against an RS256 key) is refused before its signature is looked at.
        algorithms = [self.algorithm] if self.algorithm else []
        *older, last = self._pinned
        for key in older:  # HS256 secrets of a rotation: empty with one
            try:
                return jwt.decode(token, key, algorithms=algorithms).claims
            except BadSignatureError:
                continue
        return jwt.decode(token, last, algorithms=algorithms).claims

    def _key_for(self, signed: GuestProtocol) -> _Key:
        header = signed.headers()
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise InvalidToken("token names no key: a kid header is required")
        assert self._key_set is not None
        pinned = self._key_set.get(kid)
        if pinned is None:
            hook = self.on_unknown_key
            if hook is not None:
                hook()
            raise InvalidToken("token names a key that is not in the key set")
        if header.get("alg") != pinned.alg:
            raise InvalidToken(f"token is not signed with its key's algorithm ({pinned.alg})")
        return pinned.key

    def _verify_signed(self, token: str, now: float) -> tuple[Identity, tuple[Any, Any, Any]]:
        try:
            claims = self._claims(token)
        except UnsupportedAlgorithmError:
            allowed = self.algorithm or ", ".join(ALGORITHMS)
            raise InvalidToken(f"token is not signed with {allowed}") from None
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
            role = _ROLES[claims["role"]]  # the enum's own lookup costs a microsecond more
        except (KeyError, TypeError):  # TypeError: a list or an object is no role either
            raise InvalidToken("unknown role") from None
        subject = claims["sub"]
        problem = _subject_problem(subject, role)
        if problem:
            raise InvalidToken(f"bad subject: {problem}")
        return Identity(subject=subject, role=role), times


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


def _public_key(pem: str | bytes, algorithm: Algorithm) -> _Key:
    try:
        key = load_pem_public_key(_bytes(pem))
    except ValueError as error:
        raise ValueError(f"the {algorithm} verify key is not a PEM public key: {error}") from None
    return _pinned_to(key, algorithm, "verify")


def _private_key(pem: str | bytes, algorithm: Algorithm) -> _Key:
    try:
        key = load_pem_private_key(_bytes(pem), password=None)
    except (ValueError, TypeError) as error:
        # TypeError: the PEM is encrypted; we take no passphrase.
        raise ValueError(
            f"the {algorithm} signing key is not an unencrypted PEM key: {error}"
        ) from None
    return _pinned_to(key, algorithm, "signing")


def _pinned_to(key: object, algorithm: Algorithm, role: str) -> _Key:
    imported: _Key
    with quiet_key_sizes():
        if isinstance(key, RSAPublicKey | RSAPrivateKey):
            imported = RSAKey.import_key(key)
        elif isinstance(key, EllipticCurvePublicKey | EllipticCurvePrivateKey):
            imported = ECKey.import_key(key)
        else:
            raise ValueError(f"the {algorithm} {role} key is neither an RSA nor an EC key")
    # The rules a key set's keys follow too (jwks.key_problem): one home for them.
    problem = key_problem(imported, algorithm)
    if problem:
        raise ValueError(f"the {algorithm} {role} key: {problem}")
    return imported


def _pairs(private: _Key, public: _Key) -> bool:
    # RFC 7638 thumbprints cover the public members only: equal when the keys pair.
    return private.thumbprint() == public.thumbprint()
