"""Who may do what: buyer tokens, admin tokens, and nothing else; buyers see only their own."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from redis.asyncio import Redis

from seckill.domain.events import decode_event
from seckill.security.tokens import Role, TokenCodec
from seckill.store.ledger import Ledger
from tests.api.conftest import JWT_SECRET, Api, api_settings, running_api
from tests.conftest import RedisTarget, redis_settings

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]


def claims(**overrides: object) -> dict[str, object]:
    now = int(time.time())
    base: dict[str, object] = {
        "sub": "alice", "role": "buyer", "iss": "seckill", "aud": "seckill-api",
        "iat": now, "exp": now + 600,
    }  # fmt: skip
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def hs256(payload: dict[str, object], key: str = JWT_SECRET) -> str:
    return jwt.encode(payload, key, algorithm="HS256")


def hand_signed_hs256(payload: dict[str, object], key: bytes) -> str:
    """HS256 by hand: PyJWT (rightly) refuses to use a public key as an HMAC secret."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(payload).encode())
    mac = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(hs256(claims(exp=int(time.time()) - 60)), id="expired"),
        pytest.param(hs256(claims(iss="someone-else")), id="wrong-issuer"),
        pytest.param(hs256(claims(aud="another-api")), id="wrong-audience"),
        pytest.param(hs256(claims(exp=None)), id="no-expiry"),
        pytest.param(hs256(claims(), key="another-secret-" + "q" * 30), id="wrong-key"),
        pytest.param(hs256(claims(role="root")), id="unknown-role"),
        pytest.param(jwt.encode(claims(), None, algorithm="none"), id="alg-none"),
        pytest.param("not.a.token", id="garbage"),
    ],
)
async def test_bad_tokens_get_401_and_buy_nothing(api: Api, token: str) -> None:
    item_id = await api.create_item(total=5)
    answer = await api.http.post(
        f"/api/v1/items/{item_id}/orders",
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k"},
    )
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"] == "invalid_token"
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.available == 5


async def test_no_token_is_401(api: Api) -> None:
    item_id = await api.create_item(total=5)
    answer = await api.http.post(
        f"/api/v1/items/{item_id}/orders", headers={"Idempotency-Key": "k"}
    )
    assert answer.status_code == 401
    admin = await api.http.get(f"/api/v1/admin/items/{item_id}")
    assert admin.status_code == 401


async def test_roles_keep_to_their_routes(api: Api) -> None:
    item_id = await api.create_item(total=5)
    as_buyer = await api.http.get(f"/api/v1/admin/items/{item_id}", headers=api.as_buyer("alice"))
    assert as_buyer.status_code == 403
    assert as_buyer.json()["error"] == "forbidden"
    creates = await api.http.post(
        "/api/v1/admin/items", headers=api.as_buyer("alice"), json={"name": "x"}
    )
    assert creates.status_code in {403, 422}  # never created
    as_admin = await api.http.post(
        f"/api/v1/items/{item_id}/orders", headers={**api.as_admin, "Idempotency-Key": "k"}
    )
    assert as_admin.status_code == 403


async def test_a_buyer_sees_and_cancels_only_their_own_orders(api: Api) -> None:
    item_id = await api.create_item(total=5)
    order_id = (await api.buy(item_id, "alice", "k")).json()["order_id"]
    path = f"/api/v1/items/{item_id}/orders/{order_id}"
    assert (await api.http.get(path, headers=api.as_buyer("alice"))).status_code == 200
    peek = await api.http.get(path, headers=api.as_buyer("mallory"))
    assert peek.status_code == 404
    assert peek.json()["error"] == "unknown_order"
    cancel = await api.http.post(f"{path}/cancel", headers=api.as_buyer("mallory"))
    assert cancel.status_code == 404
    hold = await api.runtime.engine.hold(item_id, int(order_id))
    assert hold is not None and hold.state.value == "held"
    mine = await api.http.post(f"{path}/cancel", headers=api.as_buyer("alice"))
    assert mine.status_code == 200
    assert mine.json()["status"] == "released"
    assert mine.json()["release_reason"] == "cancelled"


async def test_an_order_is_found_only_under_its_own_item(api_alone: Api) -> None:
    api = api_alone  # no persister: the test lands the events itself
    item_id = await api.create_item(total=5)
    other = await api.create_item(total=5)
    order_id = (await api.buy(item_id, "alice", "k")).json()["order_id"]
    elsewhere = f"/api/v1/items/{other}/orders/{order_id}"
    seen = await api.http.get(elsewhere, headers=api.as_buyer("alice"))
    assert seen.status_code == 404 and seen.json()["error"] == "unknown_order"
    cancel = await api.http.post(f"{elsewhere}/cancel", headers=api.as_buyer("alice"))
    assert cancel.status_code == 404 and cancel.json()["error"] == "unknown_order"
    hold = await api.runtime.engine.hold(item_id, int(order_id))
    assert hold is not None and hold.state.value == "held"
    for item in (item_id, other):
        stock = await api.runtime.engine.stock(item)
        assert stock is not None and stock.available == (4 if item == item_id else 5)
    # Landed in SQL and gone from Redis, the order is still found under its item, and only there.
    await api.runtime.ledger.apply(
        [decode_event(i, f) for i, f in await api.runtime.engine.events(item_id)]
    )
    await api.runtime.redis.hdel(api.runtime.engine.keys(item_id).holds, order_id)
    landed = await api.http.get(
        f"/api/v1/items/{item_id}/orders/{order_id}", headers=api.as_buyer("alice")
    )
    assert landed.status_code == 200 and landed.json()["status"] == "held", landed.text
    assert (await api.http.get(elsewhere, headers=api.as_buyer("alice"))).status_code == 404


async def test_rs256_tokens(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = tmp_path / "private.pem"
    public = tmp_path / "public.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=tmp_path,
        jwt_algorithm="RS256",
        jwt_public_key_file=public,
        jwt_private_key_file=private,
    )
    async with running_api(settings) as api:
        item_id = await api.create_item(total=2)
        assert (await api.buy(item_id, "alice", "k")).status_code == 202
        # An HS256 token signed with the public key (key confusion) is refused.
        forged = hand_signed_hs256(claims(), public.read_bytes())
        answer = await api.http.post(
            f"/api/v1/items/{item_id}/orders",
            headers={"Authorization": f"Bearer {forged}", "Idempotency-Key": "k2"},
        )
        assert answer.status_code == 401
        # Verifying needs only the public key.
        verifier = TokenCodec(
            algorithm="RS256", signing_key=None, verify_key=public.read_bytes(),
            issuer="seckill", audience="seckill-api",
        )  # fmt: skip
        assert verifier.verify(api.token("bob")).subject == "bob"
        assert verifier.verify(api.token("ops", Role.ADMIN)).role is Role.ADMIN
