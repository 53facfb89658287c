"""Bearer tokens (``seckill.security.tokens``): what passes, what is refused, how codecs are
built from the settings."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st

from seckill.security import tokens
from seckill.security.tokens import (
    LEEWAY_SECONDS,
    Identity,
    InvalidToken,
    Role,
    TokenCodec,
    token_codec,
)
from tests.unit.isolated_settings import isolated_settings

NOW = 1_700_000_000
SECRET = "s" * 32
ISSUER = "seckill"
AUDIENCE = "seckill-api"


def _hs256(secret: str = SECRET, **overrides: Any) -> TokenCodec:
    arguments: dict[str, Any] = {
        "algorithm": "HS256",
        "signing_key": secret,
        "verify_key": secret,
        "issuer": ISSUER,
        "audience": AUDIENCE,
    }
    return TokenCodec(**(arguments | overrides))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(**overrides: Any) -> dict[str, Any]:
    claims = {
        "sub": "alice",
        "role": "buyer",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": NOW,
        "exp": NOW + 60,
    }
    claims.update(overrides)
    return {name: value for name, value in claims.items() if value is not None}


def _hand_made(header: dict[str, Any], claims: dict[str, Any], sign_with: bytes | None) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    if sign_with is None:
        return signing_input + "."
    digest = hmac.new(sign_with, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(digest)}"


class RsaPair:
    def __init__(self, bits: int = 2048) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        self.private_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self.public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def codec(self, *, can_mint: bool = True) -> TokenCodec:
        return TokenCodec(
            algorithm="RS256",
            signing_key=self.private_pem if can_mint else None,
            verify_key=self.public_pem,
            issuer=ISSUER,
            audience=AUDIENCE,
        )


@pytest.fixture(scope="module")
def rsa_pair() -> RsaPair:
    return RsaPair()


@pytest.fixture(scope="module")
def other_rsa_pair() -> RsaPair:
    return RsaPair()


# --- tokens: what passes ---------------------------------------------------------------------


@pytest.mark.parametrize("role", list(Role))
def test_hs256_round_trip(role: Role) -> None:
    codec = _hs256()
    token = codec.mint("alice", role, ttl_seconds=60, now=NOW)
    assert codec.verify(token, now=NOW + 1) == Identity(subject="alice", role=role)


@pytest.mark.parametrize("role", list(Role))
def test_rs256_round_trip(rsa_pair: RsaPair, role: Role) -> None:
    token = rsa_pair.codec().mint("alice", role, ttl_seconds=60, now=NOW)
    # Only the public key is needed to check it.
    assert rsa_pair.codec(can_mint=False).verify(token, now=NOW + 1) == Identity("alice", role)


def test_tokens_carry_the_documented_claims() -> None:
    token = _hs256().mint("alice", Role.ADMIN, ttl_seconds=90, now=NOW + 0.9)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    assert jwt.decode(token, options={"verify_signature": False}) == _claims(
        role="admin", exp=NOW + 90
    )


def test_verify_without_now_uses_the_clock() -> None:
    codec = _hs256()
    assert codec.verify(codec.mint("alice", Role.BUYER, ttl_seconds=60)).subject == "alice"


def test_expiry_allows_the_leeway_and_no_more() -> None:
    codec = _hs256()
    token = codec.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    assert codec.verify(token, now=NOW + 60 + LEEWAY_SECONDS - 1).subject == "alice"
    with pytest.raises(InvalidToken, match="token expired"):
        codec.verify(token, now=NOW + 60 + LEEWAY_SECONDS)


def test_a_verified_token_is_remembered_and_its_times_checked_at_each_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codec = _hs256()
    token = codec.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    assert codec.verify(token, now=NOW) == Identity("alice", Role.BUYER)

    def unreachable(*_: Any, **__: Any) -> Any:
        raise AssertionError("a remembered token was verified again")

    monkeypatch.setattr(tokens.jwt, "decode", unreachable)
    assert codec.verify(token, now=NOW + 30) == Identity("alice", Role.BUYER)
    with pytest.raises(InvalidToken, match="token expired"):
        codec.verify(token, now=NOW + 60 + LEEWAY_SECONDS)
    with pytest.raises(InvalidToken, match="issued in the future"):
        codec.verify(token, now=NOW - 3600)


def test_a_refused_token_is_not_remembered_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codec = _hs256()
    forged = _hs256("f" * 32).mint("mallory", Role.ADMIN, ttl_seconds=60, now=NOW)
    for _ in range(2):
        with pytest.raises(InvalidToken, match="signature does not match"):
            codec.verify(forged, now=NOW)
    expired = codec.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW - 3600)
    with pytest.raises(InvalidToken, match="token expired"):
        codec.verify(expired, now=NOW)

    monkeypatch.setattr(tokens, "VERIFIED_CACHE_SIZE", 2)
    first, second, third = (
        codec.mint(name, Role.BUYER, ttl_seconds=60, now=NOW) for name in ("a1", "b2", "c3")
    )
    for token in (first, second, third):
        codec.verify(token, now=NOW)
    decoded: list[str] = []
    real_decode = tokens.jwt.decode

    def counting(token: str, *args: Any, **kwargs: Any) -> Any:
        decoded.append(token)
        return real_decode(token, *args, **kwargs)

    monkeypatch.setattr(tokens.jwt, "decode", counting)
    for token in (third, second, first):
        codec.verify(token, now=NOW)
    assert decoded == [first]  # the oldest was let go; the two newest were remembered


# --- tokens: what is refused -----------------------------------------------------------------


def test_expired_token_is_refused() -> None:
    codec = _hs256()
    with pytest.raises(InvalidToken, match="token expired"):
        codec.verify(codec.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW), now=NOW + 3600)


def test_token_from_the_future_is_refused() -> None:
    codec = _hs256()
    with pytest.raises(InvalidToken, match="issued in the future"):
        codec.verify(codec.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW + 600), now=NOW)


def test_wrong_issuer_is_refused() -> None:
    token = _hs256(issuer="someone-else").mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    with pytest.raises(InvalidToken, match="wrong issuer"):
        _hs256().verify(token, now=NOW)


def test_wrong_audience_is_refused() -> None:
    token = _hs256(audience="another-api").mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    with pytest.raises(InvalidToken, match="wrong audience"):
        _hs256().verify(token, now=NOW)


def test_token_signed_with_another_secret_is_refused() -> None:
    token = _hs256("t" * 32).mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    with pytest.raises(InvalidToken, match="signature does not match"):
        _hs256().verify(token, now=NOW)


def test_token_signed_with_another_rsa_key_is_refused(
    rsa_pair: RsaPair, other_rsa_pair: RsaPair
) -> None:
    token = other_rsa_pair.codec().mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    with pytest.raises(InvalidToken, match="signature does not match"):
        rsa_pair.codec().verify(token, now=NOW)


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_unsigned_token_is_refused(rsa_pair: RsaPair, alg: str) -> None:
    token = _hand_made({"alg": alg, "typ": "JWT"}, _claims(), sign_with=None)
    for codec in (_hs256(), rsa_pair.codec()):
        with pytest.raises(InvalidToken, match=f"not signed with {codec.algorithm}"):
            codec.verify(token, now=NOW)


def test_hs256_token_is_refused_by_an_rs256_codec(rsa_pair: RsaPair) -> None:
    token = _hs256().mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    with pytest.raises(InvalidToken, match="token is not signed with RS256"):
        rsa_pair.codec().verify(token, now=NOW)


def test_rs256_token_is_refused_by_an_hs256_codec(rsa_pair: RsaPair) -> None:
    token = rsa_pair.codec().mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    with pytest.raises(InvalidToken, match="token is not signed with HS256"):
        _hs256().verify(token, now=NOW)


def test_key_confusion_attack_is_refused(rsa_pair: RsaPair) -> None:
    # The attacker knows the public key and uses it as an HMAC secret: a verifier that picks
    # the algorithm from the token header would check this HMAC with that same public key.
    forged = _hand_made(
        {"alg": "HS256", "typ": "JWT"}, _claims(role="admin"), sign_with=rsa_pair.public_pem
    )
    # The forgery is sound as an HMAC: only the pinned algorithm stops it.
    signing_input, _, signature = forged.rpartition(".")
    expected = hmac.new(rsa_pair.public_pem, signing_input.encode(), hashlib.sha256).digest()
    assert _b64(expected) == signature
    with pytest.raises(InvalidToken, match="token is not signed with RS256"):
        rsa_pair.codec(can_mint=False).verify(forged, now=NOW)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        (_claims(sub=None), "no sub claim"),
        (_claims(role=None), "no role claim"),
        (_claims(exp=None), "no exp claim"),
        (_claims(iat=None), "no iat claim"),
        (_claims(iss=None), "no iss claim"),
        (_claims(aud=None), "no aud claim"),
        (_claims(exp=NOW - 60), "token expired"),
        (_claims(exp="tomorrow"), "token times must be numbers"),
        (_claims(exp=True), "token times must be numbers"),
        (_claims(nbf=NOW + 600), "token not valid yet"),
        (_claims(role="superuser"), "unknown role"),
        (_claims(role=["admin"]), "unknown role"),
        (_claims(sub="alice bob"), "bad subject: buyer id must be"),
        (_claims(sub=""), "no sub claim|bad subject"),
        (_claims(sub="x" * 65), "bad subject: buyer id must be"),
        (_claims(sub="ålice"), "bad subject: buyer id must be"),
        (_claims(sub=42), "subject must be a string"),
        (_claims(sub="root\n", role="admin"), "bad subject: admin subject"),
    ],
)
def test_bad_claims_are_refused(claims: dict[str, Any], message: str) -> None:
    token = _hand_made({"alg": "HS256", "typ": "JWT"}, claims, sign_with=SECRET.encode())
    with pytest.raises(InvalidToken, match=message):
        _hs256().verify(token, now=NOW)


@pytest.mark.parametrize(
    "token", ["", "abc", "a.b.c", "a.b", "....", "eyJhbGciOiJIUzI1NiJ9.e30.", "\x00"]
)
def test_garbage_is_refused(token: str) -> None:
    with pytest.raises(InvalidToken):
        _hs256().verify(token, now=NOW)


@given(token=st.text() | st.lists(st.text(), min_size=3, max_size=3).map(".".join))
def test_verify_raises_only_invalid_token(token: str) -> None:
    with pytest.raises(InvalidToken):
        _hs256().verify(token, now=NOW)


# --- tokens: construction --------------------------------------------------------------------


def test_mint_refuses_a_subject_verify_would_refuse() -> None:
    with pytest.raises(ValueError, match="buyer id must be"):
        _hs256().mint("alice bob", Role.BUYER, ttl_seconds=60)
    with pytest.raises(ValueError, match="ttl_seconds"):
        _hs256().mint("alice", Role.BUYER, ttl_seconds=0)


def test_verify_only_rs256_codec_cannot_mint(rsa_pair: RsaPair) -> None:
    codec = rsa_pair.codec(can_mint=False)
    assert not codec.can_mint
    with pytest.raises(ValueError, match="SECKILL_JWT_PRIVATE_KEY_FILE"):
        codec.mint("alice", Role.BUYER, ttl_seconds=60)


def test_unusable_keys_are_refused_at_construction(
    rsa_pair: RsaPair, other_rsa_pair: RsaPair
) -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        _hs256("short")
    with pytest.raises(ValueError, match="differ"):
        _hs256(signing_key="t" * 32)
    with pytest.raises(ValueError, match="not a PEM public key"):
        TokenCodec(
            algorithm="RS256",
            signing_key=None,
            verify_key=SECRET,
            issuer=ISSUER,
            audience=AUDIENCE,
        )
    with pytest.raises(ValueError, match="does not pair"):
        TokenCodec(
            algorithm="RS256",
            signing_key=other_rsa_pair.private_pem,
            verify_key=rsa_pair.public_pem,
            issuer=ISSUER,
            audience=AUDIENCE,
        )
    small = RsaPair(bits=1024)
    with pytest.raises(ValueError, match="at least 2048 bits"):
        small.codec()


def test_token_codecs_built_twice_agree_on_the_generated_secret(tmp_path: Path) -> None:
    first, second = (
        token_codec(isolated_settings(tmp_path)),
        token_codec(isolated_settings(tmp_path)),
    )
    assert second.verify(first.mint("alice", Role.BUYER, ttl_seconds=60)).subject == "alice"
    assert first.verify(second.mint("bob", Role.ADMIN, ttl_seconds=60)).role is Role.ADMIN
    assert (tmp_path / "secrets" / "jwt").is_file()


def test_token_codec_uses_the_configured_secret(tmp_path: Path) -> None:
    token = token_codec(isolated_settings(tmp_path, jwt_secret=SECRET)).mint(
        "alice", Role.BUYER, ttl_seconds=60, now=NOW
    )
    assert _hs256().verify(token, now=NOW).subject == "alice"
    assert not (tmp_path / "secrets").exists()


def test_token_codec_for_rs256_reads_the_key_files(tmp_path: Path, rsa_pair: RsaPair) -> None:
    public, private = tmp_path / "public.pem", tmp_path / "private.pem"
    public.write_bytes(rsa_pair.public_pem)
    private.write_bytes(rsa_pair.private_pem)
    minter = token_codec(
        isolated_settings(
            tmp_path,
            jwt_algorithm="RS256",
            jwt_private_key_file=private,
            jwt_public_key_file=public,
        )
    )
    checker = token_codec(
        isolated_settings(tmp_path, jwt_algorithm="RS256", jwt_public_key_file=public)
    )
    token = minter.mint("alice", Role.BUYER, ttl_seconds=60)
    assert checker.verify(token) == Identity("alice", Role.BUYER)
    with pytest.raises(ValueError, match="SECKILL_JWT_PRIVATE_KEY_FILE"):
        checker.mint("alice", Role.BUYER, ttl_seconds=60)
    with pytest.raises(ValueError, match="SECKILL_JWT_PUBLIC_KEY_FILE"):
        token_codec(
            isolated_settings(tmp_path, jwt_algorithm="RS256", jwt_private_key_file=private)
        )
