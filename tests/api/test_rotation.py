"""Keys rotated across restarts of the API, as docs/operations/keys.md says: what was signed
before the switch (a ticket, a token, a payment notice) still works after it, until the old key
is dropped; and a key set served over HTTP is followed while the API runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from seckill.bootstrap.workers import WorkerKind
from seckill.config import Settings
from seckill.security.jwks import parse_key_set
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role, TokenCodec
from seckill.store.ledger import Ledger
from tests.api.conftest import Answer, Api, api_settings, running_api
from tests.conftest import RedisTarget, redis_settings
from tests.support.key_sets import Served, SetKey, document, key_server, set_key

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

OLD = "old-" + "o" * 40
NEW = "new-" + "n" * 40


def staged(base: Settings, *keys: str) -> Settings:
    """``base`` with every HMAC key set to ``keys``, in this order (the first signs)."""
    value = ",".join(keys)
    return base.model_copy(
        update={"ticket_secret": value, "jwt_secret": value, "payment_secret": value}
    )


async def buy(api: Api, item_id: int, token: str, ticket: str, key: str) -> Answer:
    return await api.http.post(
        f"/api/v1/items/{item_id}/orders",
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key, TICKET_HEADER: ticket},
        json={"quantity": 1},
    )


async def test_what_was_signed_before_the_switch_works_after_it_until_the_old_key_goes(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    base = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=tmp_path,
        ticket_ttl_seconds=600,
    )
    # (b) The new key is on every host, second: the old one still signs.
    async with running_api(staged(base, OLD, NEW)) as api:
        item_id = await api.create_item(total=5, limit=2)
        alice_token = api.token("alice")
        issued = await api.issue_ticket(item_id, "alice")
        assert issued.status_code == 200, issued.text
        old_ticket = issued.json()["ticket"]
        bought = await api.buy(item_id, "bob", "bob-1")
        assert bought.status_code == 202, bought.text
        bob_order = bought.json()["order_id"]
        notice: dict[str, str | int] = {
            "payment_id": "pay-bob",
            "item_id": item_id,
            "order_id": bob_order,
            "status": "succeeded",
            "amount": 19_900,  # the item's price (the test API's), one unit
            "currency": "USD",
        }
        # The provider signs a notice with the old key; it arrives after the switch.
        late_notice = api.signed(notice, secret=OLD)
    # (c) The new key signs; the old one still verifies.
    async with running_api(staged(base, NEW, OLD), workers=(WorkerKind.PERSISTER,)) as api:
        answer = await buy(api, item_id, alice_token, old_ticket, "alice-1")
        assert answer.status_code == 202, answer.text
        body, headers = late_notice
        paid = await api.http.post("/api/v1/payments/callback", content=body, headers=headers)
        assert paid.status_code == 200, paid.text
        assert paid.json()["outcome"] == "paid"
        new_token = api.token("alice")
        issued = await api.issue_ticket(item_id, "alice")
        assert issued.status_code == 200, issued.text
        new_ticket = issued.json()["ticket"]
    # (d) The old key is dropped: what it signed is refused, what the new one signed is not.
    async with running_api(staged(base, NEW)) as api:
        refused = await buy(api, item_id, new_token, old_ticket, "alice-2")
        assert (refused.status_code, refused.json()["error"]) == (403, "invalid_ticket")
        refused = await buy(api, item_id, alice_token, new_ticket, "alice-2")
        assert (refused.status_code, refused.json()["error"]) == (401, "invalid_token")
        notice["payment_id"] = "pay-bob-again"
        body, headers = api.signed(notice, secret=OLD)
        forged = await api.http.post("/api/v1/payments/callback", content=body, headers=headers)
        assert (forged.status_code, forged.json()["error"]) == (401, "invalid_signature")
        answer = await buy(api, item_id, new_token, new_ticket, "alice-2")
        assert answer.status_code == 202, answer.text
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and (stock.available, stock.held, stock.sold) == (2, 2, 1)


def _minter(key: SetKey) -> TokenCodec:
    return TokenCodec.from_key_set(
        parse_key_set(document(key), source="test"),
        signing_kid=key.kid,
        signing_key=key.private_pem,
        issuer="seckill",
        audience="seckill-api",
    )


async def test_the_api_follows_a_key_set_served_over_http(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    old, new = set_key("old-RS256", "RS256"), set_key("new-ES256", "ES256")
    assert old.private_pem is not None
    (tmp_path / "old.pem").write_bytes(old.private_pem)
    new_token = _minter(new).mint("alice", Role.BUYER, ttl_seconds=600)
    served = Served(document(old))
    with key_server(served) as url:
        settings = api_settings(
            **redis_settings(redis_server),
            database_url=sql_url,
            data_dir=tmp_path,
            jwt_jwks_url=url,
            jwt_jwks_refresh_seconds=0.1,
            # What the test's own tokens are minted under (Api.token).
            jwt_signing_kid=old.kid,
            jwt_private_key_file=tmp_path / "old.pem",
        )
        async with running_api(settings) as api:
            item_id = await api.create_item(total=5)
            old_token = api.token("alice")

            async def ticket_status(token: str) -> int:
                answer = await api.http.post(
                    f"/api/v1/items/{item_id}/tickets",
                    headers={"Authorization": f"Bearer {token}"},
                )
                return answer.status_code

            assert await ticket_status(old_token) == 200
            assert await ticket_status(new_token) == 401
            served.body = document(old, new)  # the new key published beside the old
            await _until(lambda: ticket_status(new_token), 200)
            assert await ticket_status(old_token) == 200
            served.body = document(new)  # the old key withdrawn: its tokens stop working
            await _until(lambda: ticket_status(old_token), 401)
            assert await ticket_status(new_token) == 200


async def _until(
    status: Callable[[], Awaitable[int]], expected: int, *, within: float = 10.0
) -> None:
    deadline = time.monotonic() + within
    while (await status()) != expected:
        assert time.monotonic() < deadline, f"no {expected} within {within} s"
        await asyncio.sleep(0.05)
