"""Payment callback signatures (``seckill.security.signatures``): HMAC-SHA256 over the timestamp
and the body, refused when anything differs."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seckill.bootstrap.keys import payment_secret
from seckill.security.signatures import SIGNATURE_HEADER, BadSignature, sign, verify_signature
from tests.support.isolated_settings import isolated_settings

NOW = 1_700_000_000

# --- payment callback signatures -------------------------------------------------------------

BODY = b'{"order_id": 42, "status": "paid"}'
PAY_SECRET = b"whsec-test"


def _verify(header: str | None, *, body: bytes = BODY, now: float = NOW) -> int:
    return verify_signature(PAY_SECRET, body, header, now=now, tolerance_seconds=300)


def test_signature_round_trip() -> None:
    header = sign(PAY_SECRET, BODY, timestamp=NOW)
    assert header.startswith(f"t={NOW},v1=")
    assert _verify(header) == NOW
    assert SIGNATURE_HEADER == "Seckill-Signature"


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    # Written out independently: this is the contract the payment provider implements.
    digest = hmac.new(PAY_SECRET, f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(PAY_SECRET.decode(), BODY, timestamp=NOW) == f"t={NOW},v1={digest}"


def test_any_of_several_digests_may_match() -> None:
    old = sign(b"old-secret", BODY, timestamp=NOW).split(",")[1]
    new = sign(PAY_SECRET, BODY, timestamp=NOW).split(",")[1]
    assert _verify(f"t={NOW},{old},{new}") == NOW
    assert _verify(f"t={NOW}, {new.upper().replace('V1=', 'v1=')} ,{old}") == NOW
    assert _verify(f"v0=legacy,t={NOW},{new}") == NOW


def test_body_changed_by_one_byte_is_refused() -> None:
    header = sign(PAY_SECRET, BODY, timestamp=NOW)
    tampered = BODY.replace(b"42", b"43")
    assert len(tampered) == len(BODY)
    with pytest.raises(BadSignature, match="signature does not match"):
        _verify(header, body=tampered)


def test_wrong_secret_is_refused() -> None:
    with pytest.raises(BadSignature, match="signature does not match"):
        _verify(sign(b"another-secret", BODY, timestamp=NOW))


def test_timestamp_is_part_of_what_is_signed() -> None:
    digest = sign(PAY_SECRET, BODY, timestamp=NOW).split(",v1=")[1]
    with pytest.raises(BadSignature, match="signature does not match"):
        _verify(f"t={NOW + 1},v1={digest}")


@pytest.mark.parametrize("offset", [-301, 301, -(10**6), 10**6])
def test_timestamp_outside_the_window_is_refused(offset: int) -> None:
    header = sign(PAY_SECRET, BODY, timestamp=NOW + offset)
    with pytest.raises(BadSignature, match="signature timestamp outside the 300 s window"):
        _verify(header)


@pytest.mark.parametrize("offset", [-300, 300])
def test_timestamp_at_the_window_edge_passes(offset: int) -> None:
    assert _verify(sign(PAY_SECRET, BODY, timestamp=NOW + offset)) == NOW + offset


@pytest.mark.parametrize("header", [None, ""])
def test_missing_signature_is_refused(header: str | None) -> None:
    with pytest.raises(BadSignature, match="missing signature"):
        _verify(header)


GOOD_DIGEST = sign(PAY_SECRET, BODY, timestamp=NOW).split(",v1=")[1]


@pytest.mark.parametrize(
    "header",
    [
        f"v1={GOOD_DIGEST}",  # no t=
        f"t={NOW}",  # no v1=
        f"t=soon,v1={GOOD_DIGEST}",
        f"t=-{NOW},v1={GOOD_DIGEST}",
        f"t=1e9,v1={GOOD_DIGEST}",
        f"t=²,v1={GOOD_DIGEST}",
        f"t=,v1={GOOD_DIGEST}",
        f"t={NOW},t={NOW},v1={GOOD_DIGEST}",
        f"t={'9' * 5000},v1={GOOD_DIGEST}",
        f"t={NOW},v1=",
        f"t={NOW},v1=abc",
        f"t={NOW},v1={'é' * 64}",  # compare_digest would raise TypeError on this
        f"t={NOW},v1={GOOD_DIGEST},v1=zz",
        f"t={NOW};v1={GOOD_DIGEST}",
        "garbage",
        ",",
        " ",
    ],
)
def test_malformed_header_is_refused(header: str) -> None:
    with pytest.raises(BadSignature, match="malformed signature header"):
        _verify(header)


_header_parts = st.tuples(
    st.sampled_from(["t", "v1", "v0", "", " t", "T"]),
    st.sampled_from(["=", "", "=="]),
    st.text() | st.integers().map(str) | st.just(GOOD_DIGEST),
).map("".join)


@given(header=st.text() | st.lists(_header_parts, max_size=5).map(",".join))
def test_verify_signature_returns_or_raises_bad_signature(header: str) -> None:
    try:
        timestamp = _verify(header)
    except BadSignature:
        return
    assert timestamp == NOW  # only a genuine signature gets through


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        sign(b"", BODY, timestamp=NOW)
    with pytest.raises(ValueError, match="empty"):
        verify_signature("", BODY, "t=1,v1=00", now=NOW, tolerance_seconds=300)


def test_payment_secret_is_configured_or_generated_once(tmp_path: Path) -> None:
    configured = isolated_settings(tmp_path, payment_secret="configured-" + "k" * 21)
    assert payment_secret(configured) == (b"configured-" + b"k" * 21,)
    (generated,) = payment_secret(isolated_settings(tmp_path))
    assert (generated,) == payment_secret(isolated_settings(tmp_path))
    assert generated == (tmp_path / "secrets" / "payment").read_text().strip().encode()
    assert len(generated) >= 43  # 32 random bytes, base64


def test_payment_secret_holds_the_keys_of_a_rotation(tmp_path: Path) -> None:
    new, old = "new-key-" + "n" * 24, "old-key-" + "o" * 24
    settings = isolated_settings(tmp_path, payment_secret=f"{new}, {old}")
    assert payment_secret(settings) == (new.encode(), old.encode())
    a, b = "a" * 32, "b" * 32
    for value in (f"{a},,{b}", f",{a}", f"{a},", " , "):
        with pytest.raises(ValueError, match=r"SECKILL_PAYMENT_SECRET: key . of . is empty"):
            payment_secret(isolated_settings(tmp_path, payment_secret=value))


@pytest.mark.parametrize("value", ["k", "k" * 31, "k" * 32 + ",short"])
def test_a_payment_key_shorter_than_32_bytes_is_refused(tmp_path: Path, value: str) -> None:
    """A one-byte key was accepted: anyone who sees one signed notice finds it offline."""
    with pytest.raises(ValueError, match=r"SECKILL_PAYMENT_SECRET: key . of . has \d+ bytes"):
        payment_secret(isolated_settings(tmp_path, payment_secret=value))


def test_any_of_several_keys_verifies_and_the_first_signs() -> None:
    keys = (b"new-key", PAY_SECRET)
    assert sign(keys, BODY, timestamp=NOW) == sign(b"new-key", BODY, timestamp=NOW)
    for key in keys:
        header = sign(key, BODY, timestamp=NOW)
        assert verify_signature(keys, BODY, header, now=NOW, tolerance_seconds=300) == NOW
    stranger = sign(b"another-key", BODY, timestamp=NOW)
    with pytest.raises(BadSignature, match="signature does not match"):
        verify_signature(keys, BODY, stranger, now=NOW, tolerance_seconds=300)
    with pytest.raises(ValueError, match="empty"):
        verify_signature((b"new-key", b""), BODY, stranger, now=NOW, tolerance_seconds=300)
