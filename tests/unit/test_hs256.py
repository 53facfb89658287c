"""The short HS256 path judges exactly as the general one (joserfc) on the tokens it takes, and
hands every other token to it: the same claims, the same refusals, on hostile input too."""

from __future__ import annotations

import base64
import hmac
import json
import time
from typing import Any

import jwt as pyjwt
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc import jwt as jose_jwt
from joserfc.errors import JoseError
from joserfc.jwk import OctKey
from joserfc.util import urlsafe_b64decode

from seckill.security import hs256
from seckill.security.hs256 import Hs256Verifier
from seckill.security.keyed_mac import KeyedMac
from seckill.security.tokens import Identity, InvalidToken, Role, TokenCodec

SECRET = b"s" * 32
OTHER = b"o" * 40
NOW = 1_790_000_000
CLAIMS = {"sub": "buyer-1", "role": "buyer", "iss": "seckill", "aud": "seckill-api",
          "iat": NOW, "exp": NOW + 600}  # fmt: skip


def general(token: str, secrets: tuple[bytes, ...] = (SECRET,)) -> dict[str, Any] | None:
    """joserfc's verdict with the same secrets: the claims, or None if refused."""
    for secret in secrets:
        try:
            return jose_jwt.decode(token, OctKey.import_key(secret), algorithms=["HS256"]).claims
        except (JoseError, ValueError, TypeError):
            continue
    return None


def agrees(token: str, secrets: tuple[bytes, ...] = (SECRET,)) -> dict[str, Any] | None:
    """The short path's claims, checked against the general path: where it answers, the
    general one answers the same."""
    short = Hs256Verifier(secrets).claims(token)
    if short is not None:
        assert general(token, secrets) == short
    return short


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_it_takes_the_tokens_seckill_and_pyjwt_mint() -> None:
    codec = TokenCodec(algorithm="HS256", signing_key=SECRET, verify_key=SECRET,
                       issuer="seckill", audience="seckill-api")  # fmt: skip
    minted = codec.mint("buyer-1", Role.BUYER, ttl_seconds=60)
    assert agrees(minted) is not None
    assert agrees(pyjwt.encode(CLAIMS, SECRET, algorithm="HS256")) == CLAIMS
    no_typ = pyjwt.encode(CLAIMS, SECRET, algorithm="HS256", headers={"typ": None})
    assert json.loads(urlsafe_b64decode(no_typ.split(".")[0].encode())) == {"alg": "HS256"}
    assert agrees(no_typ) == CLAIMS


def test_any_secret_of_a_rotation_verifies() -> None:
    token = pyjwt.encode(CLAIMS, OTHER, algorithm="HS256")
    assert agrees(token, (SECRET, OTHER)) == CLAIMS
    assert agrees(token, (SECRET,)) is None


def test_it_leaves_other_headers_and_bad_tokens_to_the_general_path() -> None:
    leaves = [
        pyjwt.encode(CLAIMS, SECRET, algorithm="HS256", headers={"kid": "k1"}),
        pyjwt.encode(CLAIMS, SECRET, algorithm="HS256", headers={"typ": "at+jwt"}),
        pyjwt.encode(CLAIMS, SECRET * 2, algorithm="HS384"),
        pyjwt.encode(CLAIMS, b"x" * 32, algorithm="HS256"),  # another secret
        pyjwt.encode(CLAIMS, SECRET, algorithm="HS256") + "A",  # a longer signature
        pyjwt.encode(CLAIMS, SECRET, algorithm="HS256").replace(".", "..", 1),
        b64(b'{"alg":"none"}') + "." + b64(json.dumps(CLAIMS).encode()) + ".",
        "not a token",
        "é" * 10,
    ]
    for token in leaves:
        assert Hs256Verifier((SECRET,)).claims(token) is None, token


def test_a_signed_payload_that_is_not_an_object_is_refused_by_both() -> None:
    for payload in (b"[1]", b"1", b"", b"{", b"\xff\xfe{}"):
        header = b64(b'{"alg":"HS256","typ":"JWT"}')
        body = b64(payload)
        mac = hmac.digest(SECRET, f"{header}.{body}".encode(), "sha256")
        token = f"{header}.{body}.{b64(mac)}"
        assert Hs256Verifier((SECRET,)).claims(token) is None
        assert general(token) is None


@given(st.binary(max_size=100), st.binary(min_size=1, max_size=200))
def test_a_keyed_mac_is_hmac_sha256(message: bytes, secret: bytes) -> None:
    assert KeyedMac(secret).digest(message) == hmac.digest(secret, message, "sha256")


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.",
               max_size=12))  # fmt: skip
def test_base64url_reads_as_joserfc_reads(segment: str) -> None:
    raw = segment.encode()
    try:
        expected: bytes | None = urlsafe_b64decode(raw)
    except ValueError:  # binascii.Error is one
        expected = None
    assert hs256._base64url(raw) == expected


_TOKEN = pyjwt.encode(CLAIMS, SECRET, algorithm="HS256")


@settings(max_examples=400)
@given(st.integers(0, len(_TOKEN) - 1), st.sampled_from("AQgwxyz_-=.+/ \x00é"),
       st.sampled_from(["replace", "insert", "delete"]))  # fmt: skip
def test_a_tampered_token_gets_the_general_verdict(where: int, char: str, how: str) -> None:
    if how == "replace":
        token = _TOKEN[:where] + char + _TOKEN[where + 1 :]
    elif how == "insert":
        token = _TOKEN[:where] + char + _TOKEN[where:]
    else:
        token = _TOKEN[:where] + _TOKEN[where + 1 :]
    short = agrees(token)
    if short is None:
        assert token == _TOKEN or general(token) is None or _plain_header_differs(token)


def _plain_header_differs(token: str) -> bool:
    """A token the general path accepts and the short one leaves: only for a header the short
    path does not take (the verdict then comes from the general path anyway)."""
    header = token.split(".")[0].encode()
    return not hs256._is_plain(header)


@given(st.dictionaries(st.sampled_from(["sub", "role", "iss", "aud", "iat", "exp", "nbf", "x"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                 st.text(max_size=70), st.lists(st.text(max_size=3), max_size=2)),
                       max_size=8))  # fmt: skip
def test_the_codec_says_the_same_either_way(claims: dict[str, Any]) -> None:
    """Whatever the claims, the codec's verdict (identity, or refusal and its message) is the
    same through the short path as through the general one."""
    header = b64(b'{"alg":"HS256","typ":"JWT"}')
    body = b64(json.dumps(CLAIMS | claims).encode())
    mac = hmac.digest(SECRET, f"{header}.{body}".encode(), "sha256")
    token = f"{header}.{body}.{b64(mac)}"
    assert _verdict(token, short=True) == _verdict(token, short=False)


def _verdict(token: str, *, short: bool) -> Identity | str:
    codec = TokenCodec(algorithm="HS256", signing_key=None, verify_key=SECRET,
                       issuer="seckill", audience="seckill-api")  # fmt: skip
    if not short:
        codec._hs256 = None
    try:
        return codec.verify(token, now=NOW + 1)
    except InvalidToken as refused:
        return str(refused)


def test_a_fresh_token_is_verified_the_short_way() -> None:
    codec = TokenCodec(algorithm="HS256", signing_key=SECRET, verify_key=SECRET,
                       issuer="seckill", audience="seckill-api")  # fmt: skip
    token = codec.mint("buyer-2", Role.BUYER, ttl_seconds=60)
    assert codec._hs256 is not None and codec._hs256.claims(token) is not None
    assert codec.verify(token, now=time.time()) == Identity("buyer-2", Role.BUYER)
