"""Purchase tickets: issued in the sale window to one buyer for one item, required to buy, and
nothing but a ticket we minted, unexpired, for this buyer and item gets past the check."""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from seckill.api.app import create_app
from seckill.bootstrap.keys import ticket_secret
from seckill.config import Settings
from seckill.security.tickets import TICKET_HEADER, BadTicket, TicketCodec
from seckill.services.tickets import ADMITTED, TERMS_FRESH_S, GateDecision
from seckill.store.ledger import Ledger
from tests.api.conftest import Answer, Api, api_settings, running_api
from tests.conftest import RedisTarget, redis_settings

single_redis = pytest.mark.redis_variants("redis7")
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

KEY = "k" * 32


async def buy_with(api: Api, item_id: int, buyer: str, ticket: str | None, key: str) -> Answer:
    headers = {**api.as_buyer(buyer), "Idempotency-Key": key}
    if ticket is not None:
        headers[TICKET_HEADER] = ticket
    return await api.http.post(
        f"/api/v1/items/{item_id}/orders", headers=headers, json={"quantity": 1}
    )


def replace_part(ticket: str, index: int, value: str) -> str:
    parts = ticket.split(".")
    parts[index] = value
    return ".".join(parts)


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


async def test_a_ticket_is_issued_and_buys_until_it_expires(api: Api) -> None:
    item_id = await api.create_item(total=5, limit=2)
    before = time.time()
    issued = await api.issue_ticket(item_id, "alice")
    assert issued.status_code == 200, issued.text
    body = issued.json()
    assert set(body) == {"ticket", "expires_at"}
    expires = datetime.fromisoformat(body["expires_at"])
    assert expires.tzinfo is not None  # RFC 3339: with an offset
    ttl = api.settings.ticket_ttl_seconds
    assert before + ttl - 1 <= expires.timestamp() <= time.time() + ttl + 1
    # One ticket serves several attempts; the idempotency key still makes each one once.
    first = await buy_with(api, item_id, "alice", body["ticket"], "k1")
    assert first.status_code == 202, first.text
    again = await buy_with(api, item_id, "alice", body["ticket"], "k1")
    assert (again.status_code, again.body) == (202, first.body)
    second = await buy_with(api, item_id, "alice", body["ticket"], "k2")
    assert second.status_code == 202, second.text
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held) == (3, 2)


async def test_every_bad_ticket_is_403_and_touches_no_stock(api: Api) -> None:
    item_id = await api.create_item(total=5, limit=5)
    other_item = await api.create_item(total=5, limit=5)
    alice = await api.ticket(item_id, "alice")
    bob = await api.ticket(item_id, "bob")
    alice_elsewhere = await api.ticket(other_item, "alice")
    codec = TicketCodec(ticket_secret(api.settings))
    now_ms = int(time.time() * 1000)
    expired = codec.mint(item_id=item_id, buyer="alice", expires_at_ms=now_ms - 1)
    wrong_key = TicketCodec("another-secret-" + "z" * 32).mint(
        item_id=item_id, buyer="alice", expires_at_ms=now_ms + 60_000
    )
    mac = alice.rsplit(".", 1)[1]
    flipped = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    cases: dict[str, str | None] = {
        "no ticket": None,
        "empty": "",
        "garbage": "not-a-ticket",
        "changed mac": replace_part(alice, 4, flipped),
        "uppercase mac": replace_part(alice, 4, mac.upper()),
        "changed buyer": replace_part(alice, 2, b64("bob")),  # sent as bob below
        "changed item": replace_part(alice, 1, str(other_item)),
        "changed expiry": replace_part(alice, 3, str(now_ms + 3_600_000)),
        "changed version": replace_part(alice, 0, "v2"),
        "expired": expired,
        "another key": wrong_key,
        "another buyer's": bob,
        "another item's": alice_elsewhere,
        "trailing space": alice + " x",
        "latin-1": alice[:-1] + "é",
    }
    for n, (case, ticket) in enumerate(cases.items()):
        buyer = "bob" if case == "changed buyer" else "alice"
        answer = await buy_with(api, item_id, buyer, ticket, f"k{n}")
        assert answer.status_code == 403, (case, answer.text)
        assert answer.json()["error"] == "invalid_ticket", (case, answer.text)
        assert answer.json()["message"], case
    for changed in (item_id, other_item):
        stock = await api.runtime.engine.stock(changed)
        assert stock is not None and (stock.available, stock.held) == (5, 0)
    assert await api.runtime.engine.buyer_units(item_id) == {}
    # The genuine tickets still work.
    assert (await buy_with(api, item_id, "alice", alice, "ok")).status_code == 202
    assert (await buy_with(api, other_item, "alice", alice_elsewhere, "ok")).status_code == 202


async def test_tickets_are_issued_only_in_the_window_and_for_items_on_sale(api: Api) -> None:
    lead = api.settings.ticket_lead_seconds
    later = await api.create_item(total=5, starts_in=timedelta(hours=1), ends_in=timedelta(hours=2))
    early = await api.issue_ticket(later, "alice")
    assert (early.status_code, early.json()["error"]) == (403, "not_started")

    # Within the lead time: a ticket, but the sale itself opens on time.
    soon = await api.create_item(total=5, starts_in=timedelta(seconds=lead / 2 + 1))
    ahead = await api.issue_ticket(soon, "alice")
    assert ahead.status_code == 200, ahead.text
    refused = await buy_with(api, soon, "alice", ahead.json()["ticket"], "k")
    assert (refused.status_code, refused.json()["error"]) == (403, "not_started")

    past = await api.create_item(
        total=5, starts_in=timedelta(hours=-2), ends_in=timedelta(minutes=-1)
    )
    late = await api.issue_ticket(past, "alice")
    assert (late.status_code, late.json()["error"]) == (403, "ended")

    unknown = await api.issue_ticket(424242, "alice")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_item")
    cold = await api.create_item(total=1, warm=False)
    not_loaded = await api.issue_ticket(cold, "alice")
    assert (not_loaded.status_code, not_loaded.json()["error"]) == (404, "unknown_item")

    # Tickets are for buyers.
    on_sale = await api.create_item(total=1)
    path = f"/api/v1/items/{on_sale}/tickets"
    assert (await api.http.post(path)).status_code == 401
    assert (await api.http.post(path, headers=api.as_admin)).status_code == 403


class WaitingRoom:
    """Lets in the buyers on its list; tells the others to come back in 7 s."""

    def __init__(self, admitted: set[str]) -> None:
        self.admitted = admitted
        self.asked: list[tuple[str, int]] = []

    async def admit(self, buyer: str, item_id: int) -> GateDecision:
        self.asked.append((buyer, item_id))
        if buyer in self.admitted:
            return ADMITTED
        return GateDecision(admitted=False, retry_after_seconds=7, message="you are in the queue")


@single_redis
async def test_a_gate_that_refuses_answers_429_with_retry_after(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    gate = WaitingRoom({"alice"})
    settings = api_settings(**redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path)
    async with running_api(settings, ticket_gate=gate) as api:
        item_id = await api.create_item(total=5)
        refused = await api.issue_ticket(item_id, "mallory")
        assert refused.status_code == 429, refused.text
        assert refused.json() == {"error": "gate_refused", "message": "you are in the queue"}
        assert refused.headers["Retry-After"] == "7"
        assert (await api.buy(item_id, "alice", "k")).status_code == 202
        assert gate.asked == [("mallory", item_id), ("alice", item_id)]
        # The window is checked first: a gate only sees buyers who could buy.
        assert (await api.issue_ticket(424242, "mallory")).status_code == 404
        assert len(gate.asked) == 2
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and stock.held == 1


@single_redis
@sqlite_only
async def test_a_ticket_expires_after_its_ttl(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=tmp_path,
        ticket_ttl_seconds=1,
    )
    async with running_api(settings) as api:
        item_id = await api.create_item(total=5)
        ticket = (await api.issue_ticket(item_id, "alice")).json()["ticket"]
        await asyncio.sleep(1.1)
        answer = await buy_with(api, item_id, "alice", ticket, "k")
        assert (answer.status_code, answer.json()["error"]) == (403, "invalid_ticket")
        assert "expired" in answer.json()["message"]
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and stock.available == 5
        # The harness asks for a fresh one.
        assert (await api.buy(item_id, "alice", "k")).status_code == 202


@single_redis
@sqlite_only
async def test_odd_ticket_headers_over_http_are_403(api: Api) -> None:
    item_id = await api.create_item(total=5)
    valid = await api.ticket(item_id, "alice")
    odd = [
        " ",
        ".",
        "....",
        "v1....",
        "v1.1.YQ.1." + "0" * 64,
        "v1.1.YQ.99999999999999999999." + "a" * 64,
        "v1.-1.YQ.1." + "a" * 64,
        "v1.1.!!!.1." + "a" * 64,
        valid + "." + valid,
        valid * 3,
        "x" * 8000,
        "ÿ" * 40,
    ]
    for n, header in enumerate(odd):
        answer = await buy_with(api, item_id, "alice", header, f"k{n}")
        assert answer.status_code == 403, (header, answer.text)
        assert answer.json()["error"] == "invalid_ticket"
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.available == 5


def test_the_purchase_route_documents_the_ticket_header(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, jwt_secret="x" * 40))
    operation = app.openapi()["paths"]["/api/v1/items/{item_id}/orders"]["post"]
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert TICKET_HEADER in headers
    assert "invalid_ticket" in headers[TICKET_HEADER]["description"]
    tickets = app.openapi()["paths"]["/api/v1/items/{item_id}/tickets"]["post"]
    assert {"200", "403", "404", "429"} <= set(tickets["responses"])


# -- the codec, without HTTP ----------------------------------------------------------------------

CODEC = TicketCodec("codec-test-secret-" + "s" * 32)
NOW_MS = 1_800_000_000_000
GENUINE = CODEC.mint(item_id=42, buyer="alice.smith@example", expires_at_ms=NOW_MS + 30_000)


def test_a_genuine_ticket_reads_back() -> None:
    ticket = CODEC.check(GENUINE, item_id=42, buyer="alice.smith@example", now_ms=NOW_MS)
    assert (ticket.item_id, ticket.buyer, ticket.expires_at_ms) == (
        42,
        "alice.smith@example",
        NOW_MS + 30_000,
    )
    with pytest.raises(BadTicket, match="expired"):
        CODEC.check(GENUINE, item_id=42, buyer="alice.smith@example", now_ms=NOW_MS + 30_000)
    longest = CODEC.mint(item_id=2**63 - 1, buyer="~" * 64, expires_at_ms=10**15 - 1)
    assert CODEC.read(longest).buyer == "~" * 64


def test_short_keys_and_unreadable_values_are_refused_when_minting() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        TicketCodec("short")
    for bad in ({"item_id": 0}, {"buyer": ""}, {"buyer": "b" * 65}, {"expires_at_ms": -1}):
        fields: dict[str, object] = {"item_id": 1, "buyer": "b", "expires_at_ms": 1, **bad}
        with pytest.raises(ValueError, match="must be"):
            CODEC.mint(**fields)  # type: ignore[arg-type]


@given(st.text(max_size=300))
def test_any_text_is_a_bad_ticket(text: str) -> None:
    with pytest.raises(BadTicket):
        CODEC.check(text, item_id=42, buyer="alice.smith@example", now_ms=NOW_MS)


@given(
    st.integers(0, len(GENUINE) - 1),
    st.integers(0, len(GENUINE)),
    st.text(min_size=0, max_size=8),
)
def test_any_edit_of_a_genuine_ticket_is_a_bad_ticket(start: int, end: int, insert: str) -> None:
    start, end = min(start, end), max(start, end)
    edited = GENUINE[:start] + insert + GENUINE[end:]
    if edited == GENUINE:
        return
    with pytest.raises(BadTicket):
        CODEC.check(edited, item_id=42, buyer="alice.smith@example", now_ms=NOW_MS)


async def test_a_crowds_tickets_read_the_terms_once_a_moment(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    item_id = await api.create_item(total=50)
    engine = api.runtime.engine
    real_terms, reads = engine.terms, []

    async def counted(item: int) -> Any:
        reads.append(item)
        return await real_terms(item)

    monkeypatch.setattr(engine, "terms", counted)
    for n in range(10):
        assert (await api.issue_ticket(item_id, f"b{n}")).status_code == 200
    assert 1 <= len(reads) <= 2  # one, or two if the crowd straddled a refresh
    await asyncio.sleep(TERMS_FRESH_S + 0.05)
    assert (await api.issue_ticket(item_id, "late")).status_code == 200
    assert reads[-1] == item_id and len(reads) >= 2  # read again once the terms are stale
