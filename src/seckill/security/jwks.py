"""A JSON Web Key Set (RFC 7517) that API tokens are checked against: several keys at once, each
named by its ``kid`` and pinned to the one algorithm its ``alg`` member names.

Read from ``SECKILL_JWT_JWKS_FILE`` or fetched from ``SECKILL_JWT_JWKS_URL`` when a process builds
its token codec (``seckill.security.tokens.token_codec``); in the API,
``seckill.security.key_refresh`` then loads it again every ``SECKILL_JWT_JWKS_REFRESH_SECONDS``,
so an identity provider can publish a new key, sign with it, and retire the old one without a
restart. A load that fails keeps the last good set (and logs a warning): an unreachable
provider refuses no one.

Every key must carry ``kid`` and ``alg`` (HS256 with an ``oct`` key of at least 32 bytes, RS256
with an RSA key of at least 2048 bits, ES256 with an EC P-256 key, either public only: a private
member such as ``d`` refuses the set); keys whose ``use`` is not
``sig`` are skipped. A set that breaks these rules is refused whole, with a message naming the
setting and the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import httpx
from joserfc.errors import JoseError, SecurityWarning
from joserfc.jwk import ECKey, JWKRegistry, OctKey, RSAKey

from seckill.domain.masking import mask_in, mask_url

Algorithm = Literal["HS256", "RS256", "ES256"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
KEY_TYPES: dict[str, str] = {"HS256": "oct", "RS256": "RSA", "ES256": "EC"}
# RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
MIN_HMAC_KEY_BYTES = 32
MIN_RSA_KEY_BITS = 2048
ES256_CURVE = "P-256"

# A fetch that takes longer, from its request to its last byte, is a failed one (the last
# good set stays). Each read is bounded apart (_READ_TIMEOUT); the blocking fetch at start
# checks the whole between reads, so it ends within FETCH_TIMEOUT_SECONDS and one read.
FETCH_TIMEOUT_SECONDS = 5.0
_READ_TIMEOUT = httpx.Timeout(2.0)
# A key set is a few kilobytes; a larger answer is not one, and is not read past this.
MAX_DOCUMENT_BYTES = 1_000_000
# A private key's members (RFC 7518 §6.2.2, §6.3.2): a set that verifies tokens publishes
# public keys only, and one that carries a private key has leaked it.
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth")

Key = OctKey | RSAKey | ECKey


@dataclass(frozen=True, slots=True)
class PinnedKey:
    """A key of the set and the one algorithm it verifies."""

    alg: Algorithm
    key: Key


KeyTable = Mapping[str, PinnedKey]
"""The keys of a set by ``kid``."""


@dataclass(frozen=True, slots=True)
class JwksSource:
    """Where a deployment's key set comes from: a file or a URL (``setting`` names which)."""

    setting: str
    file: Path | None = None
    url: str = ""

    def load(self) -> dict[str, PinnedKey]:
        """The set, read or fetched now. ``ValueError`` naming the setting if it cannot be."""
        if self.file is not None:
            try:
                document = self.file.read_bytes()
            except OSError as error:
                raise ValueError(
                    f"{self.setting}: cannot read {self.file}: {error.strerror}"
                ) from None
            return parse_key_set(document, source=self.setting)
        deadline = time.monotonic() + FETCH_TIMEOUT_SECONDS
        try:
            with httpx.stream(
                "GET", self.url, timeout=_READ_TIMEOUT, follow_redirects=True
            ) as response:
                response.raise_for_status()
                self._refuse_declared_size(response)
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    self._bounded(chunks, deadline)
        except httpx.HTTPError as error:
            raise self._fetch_failed(error) from None
        return parse_key_set(b"".join(chunks), source=self.setting)

    async def aload(self, client: httpx.AsyncClient) -> dict[str, PinnedKey]:
        """``load``, without blocking the event loop on the network."""
        if self.file is not None:
            return self.load()
        deadline = time.monotonic() + FETCH_TIMEOUT_SECONDS
        try:
            async with asyncio.timeout(FETCH_TIMEOUT_SECONDS):
                async with client.stream("GET", self.url, timeout=_READ_TIMEOUT) as response:
                    response.raise_for_status()
                    self._refuse_declared_size(response)
                    chunks = []
                    async for chunk in response.aiter_bytes():
                        chunks.append(chunk)
                        self._bounded(chunks, deadline)
        except httpx.HTTPError as error:
            raise self._fetch_failed(error) from None
        except TimeoutError:
            raise self._too_slow() from None
        return parse_key_set(b"".join(chunks), source=self.setting)

    def _bounded(self, chunks: list[bytes], deadline: float) -> None:
        """Stop a fetch as soon as it outgrows a key set, or outlasts its deadline (checked
        between reads, each bounded by ``_READ_TIMEOUT``: a server that trickles a byte at a
        time never trips a read's timeout)."""
        if sum(map(len, chunks)) > MAX_DOCUMENT_BYTES:
            raise ValueError(
                f"{self.setting}: cannot fetch {mask_url(self.url)}: the answer is larger than "
                f"{MAX_DOCUMENT_BYTES} bytes, not a key set (stopped reading it there)"
            )
        if time.monotonic() > deadline:
            raise self._too_slow()

    def _refuse_declared_size(self, response: httpx.Response) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_DOCUMENT_BYTES:
            raise ValueError(
                f"{self.setting}: cannot fetch {mask_url(self.url)}: the answer is larger than "
                f"{MAX_DOCUMENT_BYTES} bytes, not a key set ({declared} announced; not read)"
            )

    def _too_slow(self) -> ValueError:
        return ValueError(
            f"{self.setting}: cannot fetch {mask_url(self.url)}: no whole answer within "
            f"{FETCH_TIMEOUT_SECONDS:g} s"
        )

    def _fetch_failed(self, error: httpx.HTTPError) -> ValueError:
        if isinstance(error, httpx.HTTPStatusError):  # its text quotes the URL whole
            detail = f"answered {error.response.status_code} {error.response.reason_phrase}"
        else:
            detail = mask_in(str(error) or type(error).__name__, self.url)
        return ValueError(f"{self.setting}: cannot fetch {mask_url(self.url)}: {detail}")


def parse_key_set(document: bytes | str, *, source: str) -> dict[str, PinnedKey]:
    """The keys of a JWKS document by ``kid``; ``ValueError`` naming ``source`` (the setting)
    and the key at fault for anything this module's rules refuse."""
    if len(document) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{source}: the key set is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        parsed = json.loads(document)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{source}: the key set is not JSON: {error}") from None
    members = parsed.get("keys") if isinstance(parsed, dict) else None
    if not isinstance(members, list):
        raise ValueError(f'{source}: a key set is a JSON object with a "keys" list')
    table: dict[str, PinnedKey] = {}
    for number, member in enumerate(members, start=1):
        if not isinstance(member, dict):
            raise ValueError(f"{source}: key {number} is not a JSON object")
        if member.get("use", "sig") != "sig":
            continue  # an encryption key, published beside the signing ones
        kid = member.get("kid")
        if not isinstance(kid, str) or not kid:
            raise ValueError(f'{source}: key {number} has no "kid" (each token names its key)')
        if kid in table:
            raise ValueError(f"{source}: two keys have the kid {kid!r}")
        table[kid] = _pinned(member, where=f"{source}: key {kid!r}")
    if not table:
        raise ValueError(f"{source}: the key set holds no signing key")
    return table


def fingerprint(table: KeyTable) -> frozenset[tuple[str, str, str]]:
    """What tells two sets apart: each key's kid, algorithm and RFC 7638 thumbprint (for an
    ``oct`` key, a digest of the secret)."""
    return frozenset((kid, pinned.alg, pinned.key.thumbprint()) for kid, pinned in table.items())


def _pinned(member: dict[str, Any], *, where: str) -> PinnedKey:
    alg = member.get("alg")
    if alg not in ALGORITHMS:
        shown = "none" if alg is None else repr(alg)
        raise ValueError(
            f'{where}: "alg" is {shown}; each key is pinned to one of {", ".join(ALGORITHMS)}'
        )
    kty = KEY_TYPES[alg]
    if member.get("kty") != kty:
        raise ValueError(f'{where}: an {alg} key has "kty": "{kty}", not {member.get("kty")!r}')
    private = [name for name in PRIVATE_MEMBERS if name in member]
    if kty != "oct" and private:
        raise ValueError(
            f"{where}: holds private key members ({', '.join(private)}): publish only the "
            "public key (and treat this private key as leaked)"
        )
    try:
        with quiet_key_sizes():
            key = JWKRegistry.import_key(member)
    except (JoseError, ValueError, TypeError) as error:
        detail = str(error) or type(error).__name__
        raise ValueError(f"{where}: not a valid {kty} key: {detail}") from None
    problem = key_problem(key, alg)
    if problem:
        raise ValueError(f"{where}: {problem}")
    assert isinstance(key, OctKey | RSAKey | ECKey)  # the kty above says which
    return PinnedKey(alg=alg, key=key)


@contextlib.contextmanager
def quiet_key_sizes() -> Iterator[None]:
    """joserfc warns when it imports a key too short; ``key_problem`` refuses it instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SecurityWarning)
        yield


def key_problem(key: Any, alg: Algorithm) -> str | None:
    """Why ``key`` cannot carry ``alg`` tokens here (wrong type, too short), or None."""
    if alg == "HS256":
        if not isinstance(key, OctKey):
            return "an HS256 key must be an oct key"
        if len(key.raw_value) < MIN_HMAC_KEY_BYTES:
            return f"an HS256 key needs at least {MIN_HMAC_KEY_BYTES} bytes"
    elif alg == "RS256":
        if not isinstance(key, RSAKey):
            return "an RS256 key must be an RSA key"
        if key.public_key.key_size < MIN_RSA_KEY_BITS:
            return f"an RS256 key needs at least {MIN_RSA_KEY_BITS} bits"
    elif not isinstance(key, ECKey) or key.curve_name != ES256_CURVE:
        return f"an ES256 key must be an EC key on {ES256_CURVE}"
    return None
