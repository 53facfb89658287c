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
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st
from joserfc.jwk import ECKey

from seckill.bootstrap.keys import token_codec
from seckill.security import tokens
from seckill.security.jwks import Algorithm, PinnedKey, parse_key_set
from seckill.security.tokens import LEEWAY_SECONDS, Identity, InvalidToken, Role, TokenCodec
from tests.support.isolated_settings import isolated_settings
from tests.support.key_sets import SetKey, document, set_key, write_document

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
    real_verify = TokenCodec._verify_signed

    def counting(self: TokenCodec, token: str, *args: Any) -> Any:
        decoded.append(token)
        return real_verify(self, token, *args)

    monkeypatch.setattr(TokenCodec, "_verify_signed", counting)
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


# --- tokens: ES256 and HS256 secret lists ----------------------------------------------------


class EcPair:
    def __init__(self, curve: ec.EllipticCurve | None = None) -> None:
        key = ec.generate_private_key(curve or ec.SECP256R1())
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
            algorithm="ES256",
            signing_key=self.private_pem if can_mint else None,
            verify_key=self.public_pem,
            issuer=ISSUER,
            audience=AUDIENCE,
        )


def test_es256_round_trip_and_pinning(rsa_pair: RsaPair) -> None:
    pair = EcPair()
    token = pair.codec().mint("alice", Role.ADMIN, ttl_seconds=60, now=NOW)
    assert jwt.get_unverified_header(token)["alg"] == "ES256"
    assert pair.codec(can_mint=False).verify(token, now=NOW + 1) == Identity("alice", Role.ADMIN)
    with pytest.raises(InvalidToken, match="token is not signed with ES256"):
        pair.codec().verify(rsa_pair.codec().mint("alice", Role.BUYER, ttl_seconds=60, now=NOW))
    forged = _hand_made({"alg": "HS256"}, _claims(role="admin"), sign_with=pair.public_pem)
    with pytest.raises(InvalidToken, match="token is not signed with ES256"):
        pair.codec().verify(forged, now=NOW)
    with pytest.raises(InvalidToken, match="signature does not match"):
        pair.codec().verify(EcPair().codec().mint("alice", Role.BUYER, ttl_seconds=60, now=NOW))
    with pytest.raises(ValueError, match="SECKILL_JWT_PRIVATE_KEY_FILE"):
        pair.codec(can_mint=False).mint("alice", Role.BUYER, ttl_seconds=60)


def test_unusable_es256_keys_are_refused(rsa_pair: RsaPair) -> None:
    with pytest.raises(ValueError, match="an ES256 key must be an EC key on P-256"):
        EcPair(ec.SECP384R1()).codec()
    pair, other = EcPair(), EcPair()
    arguments: dict[str, Any] = {"algorithm": "ES256", "issuer": ISSUER, "audience": AUDIENCE}
    with pytest.raises(ValueError, match="an ES256 key must be an EC key on P-256"):
        TokenCodec(signing_key=None, verify_key=rsa_pair.public_pem, **arguments)
    with pytest.raises(ValueError, match="does not pair"):
        TokenCodec(signing_key=other.private_pem, verify_key=pair.public_pem, **arguments)


def test_token_codec_for_es256_reads_the_key_files(tmp_path: Path) -> None:
    pair = EcPair()
    public, private = tmp_path / "public.pem", tmp_path / "private.pem"
    public.write_bytes(pair.public_pem)
    private.write_bytes(pair.private_pem)
    es256: dict[str, Any] = {"jwt_algorithm": "ES256", "jwt_public_key_file": public}
    minter = token_codec(isolated_settings(tmp_path, jwt_private_key_file=private, **es256))
    checker = token_codec(isolated_settings(tmp_path, **es256))
    assert checker.verify(minter.mint("alice", Role.BUYER, ttl_seconds=60)).subject == "alice"
    with pytest.raises(ValueError, match="ES256 needs SECKILL_JWT_PUBLIC_KEY_FILE"):
        token_codec(isolated_settings(tmp_path, jwt_algorithm="ES256"))


def test_hs256_signs_with_the_first_secret_and_verifies_with_any() -> None:
    new, old = "n" * 32, SECRET
    both = _hs256(new, verify_key=[new, old])
    by_old = _hs256(old).mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    assert both.verify(by_old, now=NOW).subject == "alice"
    by_both = both.mint("bob", Role.BUYER, ttl_seconds=60, now=NOW)
    assert _hs256(new).verify(by_both, now=NOW).subject == "bob"
    with pytest.raises(InvalidToken, match="signature does not match"):
        _hs256(old).verify(by_both, now=NOW)
    with pytest.raises(InvalidToken, match="signature does not match"):
        both.verify(_hs256("f" * 32).mint("eve", Role.BUYER, ttl_seconds=60, now=NOW), now=NOW)
    with pytest.raises(ValueError, match="at least 32 bytes"):
        _hs256(new, verify_key=[new, "short"])
    with pytest.raises(ValueError, match="differ"):
        _hs256("t" * 32, verify_key=[new, old])


def test_token_codec_reads_a_list_of_hs256_secrets(tmp_path: Path) -> None:
    new = "n" * 32
    codec = token_codec(isolated_settings(tmp_path, jwt_secret=f"{new},{SECRET}"))
    token = codec.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    assert _hs256(new).verify(token, now=NOW).subject == "alice"
    for value in (f"{new},,{SECRET}", f"{new},"):
        with pytest.raises(ValueError, match=r"SECKILL_JWT_SECRET: key 2 of . is empty"):
            token_codec(isolated_settings(tmp_path, jwt_secret=value))


# --- tokens: a key set (JWKS), each key pinned to its alg -------------------------------------


def _key_set(*keys: SetKey | dict[str, Any]) -> dict[str, PinnedKey]:
    return parse_key_set(document(*keys), source="SECKILL_JWT_JWKS_FILE")


def _verifier(*keys: SetKey) -> TokenCodec:
    return TokenCodec.from_key_set(_key_set(*keys), issuer=ISSUER, audience=AUDIENCE)


def _minter(key: SetKey) -> TokenCodec:
    return TokenCodec.from_key_set(
        _key_set(key),
        signing_kid=key.kid,
        signing_key=key.private_pem,
        issuer=ISSUER,
        audience=AUDIENCE,
    )


@pytest.mark.parametrize("alg", ["HS256", "RS256", "ES256"])
def test_a_key_set_verifies_each_token_with_the_key_it_names(alg: Algorithm) -> None:
    key = set_key(f"k-{alg}", alg)
    others = (set_key("o-HS256", "HS256"), set_key("o-ES256", "ES256"))
    token = _minter(key).mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    assert jwt.get_unverified_header(token) == {"alg": alg, "kid": key.kid, "typ": "JWT"}
    codec = _verifier(*others, key)
    assert codec.verify(token, now=NOW) == Identity("alice", Role.BUYER)
    assert codec.key_ids == ("o-HS256", "o-ES256", key.kid)


def test_a_key_set_refuses_a_token_without_kid_or_with_an_unknown_one() -> None:
    key = set_key("k-HS256", "HS256")
    secret = key.key.raw_value
    codec = _verifier(key)
    # Signed with the right secret, but naming no key: a set does not guess.
    no_kid = _hand_made({"alg": "HS256", "typ": "JWT"}, _claims(), sign_with=secret)
    with pytest.raises(InvalidToken, match="names no key: a kid header is required"):
        codec.verify(no_kid, now=NOW)
    empty = _hand_made({"alg": "HS256", "kid": ""}, _claims(), sign_with=secret)
    with pytest.raises(InvalidToken, match="names no key"):
        codec.verify(empty, now=NOW)
    for kid in (7, ["k-HS256"], None):  # a kid must be a string (RFC 7515 §4.1.4)
        odd = _hand_made({"alg": "HS256", "kid": kid}, _claims(), sign_with=secret)
        with pytest.raises(InvalidToken, match="malformed token"):
            codec.verify(odd, now=NOW)
    unknown = _hand_made({"alg": "HS256", "kid": "k-other"}, _claims(), sign_with=secret)
    with pytest.raises(InvalidToken, match="names a key that is not in the key set"):
        codec.verify(unknown, now=NOW)


def test_a_key_set_refuses_an_alg_that_is_not_the_keys() -> None:
    rsa_key, ec_key = set_key("k-RS256", "RS256"), set_key("k-ES256", "ES256")
    codec = _verifier(rsa_key, ec_key)
    # Key confusion: an HS256 token "signed" with the RS256 key's public PEM, naming that key.
    public_pem = rsa_key.key.as_pem(private=False)
    confused = _hand_made({"alg": "HS256", "kid": rsa_key.kid}, _claims(), sign_with=public_pem)
    with pytest.raises(InvalidToken, match=r"not signed with its key's algorithm \(RS256\)"):
        codec.verify(confused, now=NOW)
    # A genuine RS256 signature, but naming the ES256 key.
    token = _minter(rsa_key).mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
    _, claims, signature = token.split(".")
    relabelled = _b64(json.dumps({"alg": "RS256", "kid": ec_key.kid}).encode())
    with pytest.raises(InvalidToken, match=r"not signed with its key's algorithm \(ES256\)"):
        codec.verify(f"{relabelled}.{claims}.{signature}", now=NOW)
    for alg in ("none", "HS512", "PS256"):
        unsigned = _hand_made({"alg": alg, "kid": rsa_key.kid}, _claims(), sign_with=None)
        with pytest.raises(InvalidToken, match="not signed with HS256, RS256, ES256"):
            codec.verify(unsigned, now=NOW)


@given(token=st.text() | st.lists(st.text(), min_size=3, max_size=3).map(".".join))
def test_a_key_set_codec_raises_only_invalid_token(token: str) -> None:
    with pytest.raises(InvalidToken):
        _verifier(set_key("k-HS256", "HS256")).verify(token, now=NOW)


def test_unknown_kids_call_the_codecs_hook() -> None:
    key, stranger = set_key("k-HS256", "HS256"), set_key("o-HS256", "HS256")
    codec = _verifier(key)
    calls: list[None] = []
    codec.on_unknown_key = lambda: calls.append(None)
    codec.verify(_minter(key).mint("alice", Role.BUYER, ttl_seconds=60, now=NOW), now=NOW)
    with pytest.raises(InvalidToken):
        codec.verify(_minter(stranger).mint("eve", Role.BUYER, ttl_seconds=60, now=NOW), now=NOW)
    assert len(calls) == 1


_K32 = base64.urlsafe_b64encode(b"k" * 32).rstrip(b"=").decode()  # 32 bytes, base64url


def _oct(**members: Any) -> dict[str, Any]:
    return {"kty": "oct", "kid": "a", "alg": "HS256", "k": _K32} | members


def _members(*members: Any) -> bytes:
    return json.dumps({"keys": list(members)}).encode()


_NO_ALG = {"kty": "oct", "kid": "a", "k": _K32}
_SMALL_RSA = {"kty": "RSA", "kid": "r", "alg": "RS256", "n": "AQAB", "e": "AQAB"}
_BAD_EC = {"kty": "EC", "kid": "e", "alg": "ES256", "crv": "P-256", "x": "AA", "y": "AA"}


@pytest.mark.parametrize(
    ("document_text", "message"),
    [
        (b"{not json", "the key set is not JSON"),
        (b'{"kid": "a"}', 'a JSON object with a "keys" list'),
        (b"[]", 'a JSON object with a "keys" list'),
        (_members(), "holds no signing key"),
        (_members(7), "key 1 is not a JSON object"),
        (_members(_oct(kid=None)), 'key 1 has no "kid"'),
        (_members(_NO_ALG), "key 'a': \"alg\" is none; each key is pinned to one of HS256"),
        (_members(_oct(alg="HS512", k=_K32 * 2)), "key 'a': \"alg\" is 'HS512'"),
        (_members(_oct(alg="RS256")), 'key \'a\': an RS256 key has "kty": "RSA"'),
        (_members(_oct(k="c2hvcnQ")), "key 'a': an HS256 key needs at least 32 bytes"),
        (_members(_oct(), _oct()), "two keys have the kid 'a'"),
        (_members(_SMALL_RSA), "key 'r': (not a valid RSA key|an RS256 key needs at least 2048)"),
        (_members(_BAD_EC), "key 'e': not a valid EC key"),
        (_members(_oct(k="a" * 43)), "key 'a': not a valid oct key: Error"),
    ],
)  # fmt: skip
def test_a_key_set_that_breaks_the_rules_is_refused_whole(
    document_text: bytes, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^SECKILL_JWT_JWKS_FILE: .*{message}"):
        parse_key_set(document_text, source="SECKILL_JWT_JWKS_FILE")


def test_a_key_set_skips_encryption_keys_and_checks_curves() -> None:
    encryption = dict(set_key("k-RS256", "RS256").published, kid="enc", use="enc", alg="RSA-OAEP")
    table = _key_set(encryption, set_key("k-HS256", "HS256"))
    assert list(table) == ["k-HS256"]
    p384 = ECKey.generate_key("P-384", parameters={"kid": "p384", "alg": "ES256"})
    with pytest.raises(ValueError, match="an ES256 key must be an EC key on P-256"):
        _key_set(dict(p384.as_dict(private=False)))


def test_minting_under_a_key_of_the_set(rsa_pair: RsaPair) -> None:
    rsa_key, oct_key = set_key("k-RS256", "RS256"), set_key("k-HS256", "HS256")
    table = _key_set(rsa_key, oct_key)
    named: dict[str, Any] = {"issuer": ISSUER, "audience": AUDIENCE}
    verifier = TokenCodec.from_key_set(table, **named)
    assert not verifier.can_mint
    with pytest.raises(ValueError, match="SECKILL_JWT_SIGNING_KID"):
        verifier.mint("alice", Role.BUYER, ttl_seconds=60)
    with pytest.raises(ValueError, match="names 'k-other', which is not in the key set"):
        TokenCodec.from_key_set(table, signing_kid="k-other", **named)
    with pytest.raises(ValueError, match="needs its private key: set SECKILL_JWT_PRIVATE_KEY_FILE"):
        TokenCodec.from_key_set(table, signing_kid=rsa_key.kid, **named)
    with pytest.raises(ValueError, match="does not pair with the key published as 'k-RS256'"):
        TokenCodec.from_key_set(
            table, signing_kid=rsa_key.kid, signing_key=rsa_pair.private_pem, **named
        )
    with pytest.raises(ValueError, match="SECKILL_JWT_PRIVATE_KEY_FILE is for RS256 and ES256"):
        TokenCodec.from_key_set(
            table, signing_kid=oct_key.kid, signing_key=rsa_pair.private_pem, **named
        )
    with pytest.raises(ValueError, match="set SECKILL_JWT_SIGNING_KID"):
        TokenCodec.from_key_set(table, signing_key=rsa_key.private_pem, **named)
    with pytest.raises(ValueError, match="not a key set"):
        _hs256().use_keys(table)
    for key in (rsa_key, oct_key):
        minter = TokenCodec.from_key_set(
            table, signing_kid=key.kid, signing_key=key.private_pem, **named
        )
        token = minter.mint("alice", Role.BUYER, ttl_seconds=60, now=NOW)
        assert verifier.verify(token, now=NOW).subject == "alice"


def test_token_codec_reads_a_key_set_file(tmp_path: Path) -> None:
    key = set_key("k-ES256", "ES256")
    path = write_document(tmp_path / "jwks.json", set_key("k-HS256", "HS256"), key)
    assert key.private_pem is not None
    (tmp_path / "private.pem").write_bytes(key.private_pem)
    minter = token_codec(
        isolated_settings(
            tmp_path,
            jwt_jwks_file=path,
            jwt_signing_kid=key.kid,
            jwt_private_key_file=tmp_path / "private.pem",
        )
    )
    # A key set replaces jwt_algorithm's keys: no HS256 secret is generated.
    checker = token_codec(isolated_settings(tmp_path, jwt_jwks_file=path))
    assert checker.verify(minter.mint("alice", Role.BUYER, ttl_seconds=60)).subject == "alice"
    assert not (tmp_path / "secrets").exists()
    with pytest.raises(ValueError, match=r"SECKILL_JWT_JWKS_FILE: .*not JSON"):
        token_codec(isolated_settings(tmp_path, jwt_jwks_file=tmp_path / "private.pem"))
