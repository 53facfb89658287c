"""CORS from one place for every route, the lean buyer routes included: a preflight from an
allowed origin is answered with the headers, another origin gets none, and with no origin
configured (the default) no answer carries any."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from redis.asyncio import Redis

from seckill.store.ledger import Ledger
from tests.api.conftest import Api, api_settings, running_api
from tests.conftest import RedisTarget, redis_settings

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

SHOP = "https://shop.example"
PURCHASE = "/api/v1/items/{item_id}/orders"
ADMIN_ITEMS = "/api/v1/admin/items"


@pytest.fixture
async def shop_api(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    settings = api_settings(
        **redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path,
        cors_origins=[SHOP],
    )  # fmt: skip
    async with running_api(settings) as live:
        yield live


def preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key, "
        "seckill-ticket",
    }


def lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def cors_headers(headers: Mapping[str, str]) -> set[str]:
    return {name for name in lower(headers) if name.startswith("access-control-")}


@pytest.mark.parametrize(("path", "method"), [(PURCHASE, "POST"), (ADMIN_ITEMS, "GET")])
async def test_a_preflight_from_the_shop_is_allowed(shop_api: Api, path: str, method: str) -> None:
    answer = await shop_api.http.request(
        "OPTIONS", path.format(item_id=1), headers=preflight(SHOP, method)
    )
    assert answer.status_code == 200, answer.text
    assert lower(answer.headers)["access-control-allow-origin"] == SHOP
    assert method in lower(answer.headers)["access-control-allow-methods"]
    allowed = lower(answer.headers)["access-control-allow-headers"].lower()
    assert {"authorization", "idempotency-key", "seckill-ticket"} <= {
        h.strip() for h in allowed.split(",")
    }


@pytest.mark.parametrize(("path", "method"), [(PURCHASE, "POST"), (ADMIN_ITEMS, "GET")])
async def test_a_preflight_from_another_origin_gets_no_cors_headers(
    shop_api: Api, path: str, method: str
) -> None:
    answer = await shop_api.http.request(
        "OPTIONS", path.format(item_id=1), headers=preflight("https://evil.example", method)
    )
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in cors_headers(answer.headers)


async def test_answers_of_lean_and_framework_routes_carry_the_origin(shop_api: Api) -> None:
    item_id = await shop_api.create_item(total=5)
    origin = {"Origin": SHOP}
    bought = await shop_api.http.post(
        PURCHASE.format(item_id=item_id),
        headers={**shop_api.as_buyer("alice"), **origin},  # no key: the lean route's 400
        json={"quantity": 1},
    )
    assert bought.status_code == 400, bought.text
    assert lower(bought.headers)["access-control-allow-origin"] == SHOP
    assert "retry-after" in lower(bought.headers)["access-control-expose-headers"].lower()
    listed = await shop_api.http.get(ADMIN_ITEMS, headers={**shop_api.as_admin, **origin})
    assert listed.status_code == 200, listed.text
    assert lower(listed.headers)["access-control-allow-origin"] == SHOP
    other = await shop_api.http.get(
        ADMIN_ITEMS, headers={**shop_api.as_admin, "Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in cors_headers(other.headers)


async def test_with_no_origin_configured_no_answer_has_cors_headers(api: Api) -> None:
    assert api.settings.cors_origins == []
    for path, method in [(PURCHASE, "POST"), (ADMIN_ITEMS, "GET")]:
        answer = await api.http.request(
            "OPTIONS", path.format(item_id=1), headers=preflight(SHOP, method)
        )
        assert answer.status_code == 405, answer.text
        assert cors_headers(answer.headers) == set()
    listed = await api.http.get(ADMIN_ITEMS, headers={**api.as_admin, "Origin": SHOP})
    assert listed.status_code == 200
    assert cors_headers(listed.headers) == set()
