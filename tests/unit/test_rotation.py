"""Every key rotates as docs/operations/keys.md says, without refusing anyone: (a) the old key
alone; (b) the new key added everywhere, second, the old one still signing; (c) the new key
first, signing, the old one second; (d) the old key dropped. Texts signed with the old key
before the switch pass until (d), and only then are refused; texts signed with the new one pass
from (b) on, so hosts still at (b) accept what hosts already at (c) sign."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from seckill.bootstrap.keys import payment_secret, refreshing_keys, ticket_secret, token_codec
from seckill.config import Settings
from seckill.security.jwks import Algorithm, parse_key_set
from seckill.security.passes import BadPass, PassCodec, QueuePass
from seckill.security.signatures import BadSignature, sign, verify_signature
from seckill.security.tickets import BadTicket, TicketCodec
from seckill.security.tokens import InvalidToken, Role, TokenCodec
from tests.support.isolated_settings import isolated_settings
from tests.support.key_sets import (
    Served,
    SetKey,
    document,
    key_server,
    set_key,
    write_document,
)

NOW = 1_700_000_000
NOW_MS = NOW * 1000
OLD = "old-key-" + "o" * 32
NEW = "new-key-" + "n" * 32

Sign = Callable[[Sequence[str]], str]
Verifies = Callable[[Sequence[str], str], bool]


def assert_rotates(sign: Sign, verifies: Verifies, old: str, new: str) -> None:
    """``sign(keys)`` signs a text as a host configured with ``keys`` does; ``verifies(keys,
    text)`` says whether such a host accepts it."""
    a, b, c, d = [old], [old, new], [new, old], [new]
    before = sign(a)
    during = sign(b)  # the old key still signs
    after = sign(c)  # the new key signs
    # (a) and (b) accept what either signs: adding a key changes nothing for anyone.
    for stage in (a, b):
        assert verifies(stage, before) and verifies(stage, during)
    # Hosts still at (b) accept what hosts already at (c) sign, and the other way round.
    assert verifies(b, after)
    assert verifies(c, before) and verifies(c, during) and verifies(c, after)
    # (d): the old key's texts are refused, the new key's pass.
    assert verifies(d, after)
    assert not verifies(d, before) and not verifies(d, during)
    # Why (b) comes first: a host that knows only the old key refuses the new key's texts.
    assert not verifies(a, after)


# --- HMAC keys: tickets, queue passes, payment notices ----------------------------------------


def test_the_ticket_key_rotates(tmp_path: Path) -> None:
    def codec(keys: Sequence[str]) -> TicketCodec:
        settings = isolated_settings(tmp_path, ticket_secret=",".join(keys))
        return TicketCodec(ticket_secret(settings))

    def sign(keys: Sequence[str]) -> str:
        return codec(keys).mint(item_id=7, buyer="alice", expires_at_ms=NOW_MS + 30_000)

    def verifies(keys: Sequence[str], text: str) -> bool:
        try:
            codec(keys).check(text, item_id=7, buyer="alice", now_ms=NOW_MS)
        except BadTicket as refused:
            if str(refused) != "ticket signature does not match":
                raise
            return False
        return True

    assert_rotates(sign, verifies, OLD, NEW)


def test_the_queue_pass_key_rotates(tmp_path: Path) -> None:
    # Passes are signed with the ticket secret: they rotate with it.
    def codec(keys: Sequence[str]) -> PassCodec:
        settings = isolated_settings(tmp_path, ticket_secret=",".join(keys))
        return PassCodec(ticket_secret(settings))

    queue_pass = QueuePass(item_id=7, buyer="alice", position=12, expires_at_ms=NOW_MS + 60_000)

    def sign(keys: Sequence[str]) -> str:
        return codec(keys).mint(queue_pass)

    def verifies(keys: Sequence[str], text: str) -> bool:
        try:
            found = codec(keys).check(text, item_id=7, buyer="alice", now_ms=NOW_MS)
        except BadPass as refused:
            if str(refused) != "queue pass signature does not match":
                raise
            return False
        assert found == queue_pass
        return True

    assert_rotates(sign, verifies, OLD, NEW)


def test_the_payment_key_rotates(tmp_path: Path) -> None:
    body = b'{"payment_id": "p-1", "item_id": 7, "order_id": "42", "status": "succeeded"}'

    def keys_of(keys: Sequence[str]) -> tuple[bytes, ...]:
        return payment_secret(isolated_settings(tmp_path, payment_secret=",".join(keys)))

    def sign_notice(keys: Sequence[str]) -> str:
        # What the crowd (standing in for the provider) does: sign with the first key.
        return sign(keys_of(keys)[0], body, timestamp=NOW)

    def verifies(keys: Sequence[str], header: str) -> bool:
        try:
            verify_signature(keys_of(keys), body, header, now=NOW, tolerance_seconds=300)
        except BadSignature:
            return False
        return True

    assert_rotates(sign_notice, verifies, OLD, NEW)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a" * 32 + ",," + "b" * 32, "SECKILL_TICKET_SECRET: key 2 of 3 is empty"),
        ("a" * 32 + ",", "SECKILL_TICKET_SECRET: key 2 of 2 is empty"),
        ("a" * 32 + ",short", "key 2 of 2 has 5 bytes; each needs at least 32"),
    ],
)  # fmt: skip
def test_a_ticket_key_list_with_a_bad_key_is_refused(
    tmp_path: Path, value: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ticket_secret(isolated_settings(tmp_path, ticket_secret=value))


def test_spaces_around_the_commas_are_not_part_of_a_key(tmp_path: Path) -> None:
    settings = isolated_settings(tmp_path, ticket_secret=f" {NEW} , {OLD} ")
    assert ticket_secret(settings) == (NEW.encode(), OLD.encode())


# --- tokens: HS256 secrets ---------------------------------------------------------------------


def _token_verifies(codec: TokenCodec, token: str, *, now: float | None = NOW + 1) -> bool:
    try:
        codec.verify(token, now=now)
    except InvalidToken:
        return False
    return True


def test_the_hs256_token_secret_rotates(tmp_path: Path) -> None:
    def codec(keys: Sequence[str]) -> TokenCodec:
        return token_codec(isolated_settings(tmp_path, jwt_secret=",".join(keys)))

    def sign(keys: Sequence[str]) -> str:
        return codec(keys).mint("alice", Role.BUYER, ttl_seconds=600, now=NOW)

    assert_rotates(sign, lambda keys, token: _token_verifies(codec(keys), token), OLD, NEW)


def test_an_hs256_secret_list_with_a_short_key_is_refused(tmp_path: Path) -> None:
    settings = isolated_settings(tmp_path, jwt_secret=f"{NEW},short")
    with pytest.raises(ValueError, match="SECKILL_JWT_SECRET: key 2 of 2 has 5 bytes"):
        token_codec(settings)


# --- tokens: a key set ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_alg", "new_alg"),
    [("RS256", "RS256"), ("ES256", "ES256"), ("HS256", "HS256"), ("RS256", "ES256")],
)
def test_a_key_of_the_set_rotates(tmp_path: Path, old_alg: Algorithm, new_alg: Algorithm) -> None:
    old, new = set_key(f"old-{old_alg}", old_alg), set_key(f"new-{new_alg}", new_alg)
    keys = {key.kid: key for key in (old, new)}

    def codec(kids: Sequence[str]) -> TokenCodec:
        # The set publishes the keys in this order; the first is the one tokens are minted
        # under (SECKILL_JWT_SIGNING_KID), with its private key when it has one.
        path = write_document(tmp_path / "jwks.json", *(keys[kid] for kid in kids))
        signer = keys[kids[0]]
        private = None
        if signer.private_pem is not None:
            private = tmp_path / f"{signer.kid}.pem"
            private.write_bytes(signer.private_pem)
        settings = isolated_settings(
            tmp_path,
            jwt_jwks_file=path,
            jwt_signing_kid=signer.kid,
            jwt_private_key_file=private,
        )
        return token_codec(settings)

    def sign(kids: Sequence[str]) -> str:
        return codec(kids).mint("alice", Role.BUYER, ttl_seconds=600, now=NOW)

    assert_rotates(sign, lambda kids, token: _token_verifies(codec(kids), token), old.kid, new.kid)


def test_a_key_removed_from_the_set_verifies_no_more_even_cached() -> None:
    old, new = set_key("old-RS256", "RS256"), set_key("new-HS256", "HS256")
    both = parse_key_set(document(old, new), source="test")
    codec = TokenCodec.from_key_set(both, issuer="seckill", audience="seckill-api")
    token = _minter(old).mint("alice", Role.BUYER, ttl_seconds=600, now=NOW)
    assert _token_verifies(codec, token)
    assert _token_verifies(codec, token)  # now from the cache of verified tokens
    # The same set again changes nothing (and keeps the cache).
    assert not codec.use_keys(parse_key_set(document(old, new), source="test"))
    assert codec.use_keys(parse_key_set(document(new), source="test"))
    with pytest.raises(InvalidToken, match="not in the key set"):
        codec.verify(token, now=NOW + 1)


# --- a key set served over HTTP, refreshed while the API runs ---------------------------------


def _minter(key: SetKey) -> TokenCodec:
    return TokenCodec.from_key_set(
        parse_key_set(document(key), source="test"),
        signing_kid=key.kid,
        signing_key=key.private_pem,
        issuer="seckill",
        audience="seckill-api",
    )


async def until(condition: Callable[[], bool], *, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.02)


def _url_settings(tmp_path: Path, url: str, *, refresh_seconds: float) -> Settings:
    return isolated_settings(tmp_path, jwt_jwks_url=url, jwt_jwks_refresh_seconds=refresh_seconds)


async def test_a_key_set_served_over_http_rotates_while_the_codec_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = set_key("old-RS256", "RS256"), set_key("new-ES256", "ES256")
    old_token = _minter(old).mint("alice", Role.BUYER, ttl_seconds=600)
    new_token = _minter(new).mint("bob", Role.BUYER, ttl_seconds=600)
    served = Served(document(old))
    with key_server(served) as url:
        settings = _url_settings(tmp_path, url, refresh_seconds=0.05)
        codec = token_codec(settings)  # fetched at start
        assert served.requests == 1
        assert codec.verify(old_token).subject == "alice"
        async with refreshing_keys(codec, settings):
            served.body = document(old, new)  # (b): the new key published
            await until(lambda: _token_verifies(codec, new_token, now=None))
            assert codec.key_ids == (old.kid, new.kid)
            assert _token_verifies(codec, old_token, now=None)
            served.body = document(new)  # (d): the old key dropped
            await until(lambda: not _token_verifies(codec, old_token, now=None))
            with pytest.raises(InvalidToken, match="not in the key set"):
                codec.verify(old_token)
            # A failed load keeps the last good set, and says so.
            for status, body in ((503, b"down for maintenance"), (200, b'{"keys": "none"}')):
                served.status, served.body = status, body
                # Two loads failed, each said so (the warning follows the answer: waited for).
                warned = caplog.text.count("the last good set stays")
                with caplog.at_level(logging.WARNING, logger="seckill.security.key_refresh"):
                    await until(
                        lambda: caplog.text.count("the last good set stays") >= warned + 2  # noqa: B023
                    )
                assert codec.verify(new_token).subject == "bob"
                assert codec.key_ids == (new.kid,)
        assert caplog.text.count("the last good set stays") >= 4
        assert "503" in caplog.text and '"keys" list' in caplog.text
        assert codec.on_unknown_key is None  # the refresher is gone with the context


async def test_a_token_naming_a_key_not_yet_loaded_asks_for_one_early_load(
    tmp_path: Path,
) -> None:
    old, new, ghost = (
        set_key("old-HS256", "HS256"), set_key("new-HS256", "HS256"), set_key("ghost", "HS256")
    )  # fmt: skip
    new_token = _minter(new).mint("bob", Role.BUYER, ttl_seconds=600)
    ghost_token = _minter(ghost).mint("mallory", Role.BUYER, ttl_seconds=600)
    served = Served(document(old))
    with key_server(served) as url:
        settings = _url_settings(tmp_path, url, refresh_seconds=600)  # none on schedule here
        codec = token_codec(settings)
        async with refreshing_keys(codec, settings):
            await until(lambda: codec.on_unknown_key is not None)
            served.body = document(old, new)
            # The first token signed with a key just published is refused (its caller retries)
            # and has the set loaded at once.
            with pytest.raises(InvalidToken, match="not in the key set"):
                codec.verify(new_token)
            await until(lambda: _token_verifies(codec, new_token, now=None))
            assert served.requests == 2
            # Made-up kids cost the provider nothing more: one early load per 30 s at most.
            for _ in range(50):
                with pytest.raises(InvalidToken, match="not in the key set"):
                    codec.verify(ghost_token)
            await asyncio.sleep(0.3)
            assert served.requests == 2


def test_no_key_set_no_start(tmp_path: Path) -> None:
    served = Served(b"")
    served.status = 404
    with (
        key_server(served) as url,
        pytest.raises(ValueError, match=r"SECKILL_JWT_JWKS_URL: cannot fetch .*404"),
    ):
        token_codec(_url_settings(tmp_path, url, refresh_seconds=300))
    with pytest.raises(ValueError, match="SECKILL_JWT_JWKS_FILE: cannot read"):
        token_codec(isolated_settings(tmp_path, jwt_jwks_file=tmp_path / "absent.json"))
    both = isolated_settings(
        tmp_path, jwt_jwks_file=tmp_path / "jwks.json", jwt_jwks_url="http://127.0.0.1:9/jwks"
    )
    with pytest.raises(ValueError, match="both SECKILL_JWT_JWKS_FILE and SECKILL_JWT_JWKS_URL"):
        token_codec(both)
