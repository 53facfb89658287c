"""The dashboard in a real browser (the system Chromium, headless): it follows a sale as it
happens, ends on the counters the admin API gives, loads nothing from outside the server, and
tells an operator whose token is refused why.

A screenshot of the page after the sale is kept in ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from seckill.bootstrap.workers import WorkerKind, build_worker
from seckill.security.tokens import Role
from tests.api.conftest import Api, served  # noqa: F401  (the fixture)
from tests.support.chromium import CHROMIUM_ARGS, chromium_path

# One Redis and one SQL backend: the page does not differ between them.
pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
UNITS = 20
FIRST_WAVE = 5
PURCHASE_ROUTE = "/api/v1/items/{item_id}/orders"
SEEN_WITHIN_MS = 10_000  # the page polls every second


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    executable = chromium_path()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str], list[str]]:
    """The page at ``url``, with every URL it requests and every script error it raises."""
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    requested: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(url)
    return page, requested, errors


async def sell(api: Api, item_id: int, buyers: range) -> None:
    """Each buyer buys one unit and pays for it, one after another."""
    for n in buyers:
        bought = await api.buy(item_id, f"buyer-{n}", f"key-{n}")
        assert bought.status_code == 202, bought.text
        paid = await api.pay(item_id, bought.json()["order_id"], f"pay-{n}")
        assert paid.json()["outcome"] == "paid", paid.text
        await asyncio.sleep(0.05)


async def test_the_dashboard_follows_a_sale(served: Api) -> None:  # noqa: F811
    api = served
    item_id = await api.create_item(total=UNITS, limit=1)
    admin = api.token("ops", Role.ADMIN)
    async with chromium() as browser:
        page, requested, errors = await open_page(
            browser, f"{api.http.base_url}/dashboard#token={admin}"
        )
        sold = page.locator(f'[data-item="{item_id}"][data-field="sold"]')
        await expect(sold).to_have_text("0", timeout=SEEN_WITHIN_MS)
        assert "token" not in page.url  # taken out of the address bar

        await sell(api, item_id, range(FIRST_WAVE))
        # The page shows the sale half way, not only its end.
        await expect(sold).to_have_text(str(FIRST_WAVE), timeout=SEEN_WITHIN_MS)
        await sell(api, item_id, range(FIRST_WAVE, UNITS))
        await expect(sold).to_have_text(str(UNITS), timeout=SEEN_WITHIN_MS)

        def field(name: str) -> str:
            return f'[data-item="{item_id}"][data-field="{name}"]'

        await expect(page.locator(field("backlog"))).to_have_text("0", timeout=SEEN_WITHIN_MS)
        counters = await api.http.get(f"/api/v1/admin/items/{item_id}", headers=api.as_admin)
        assert counters.status_code == 200, counters.text
        redis = counters.json()["redis"]
        assert redis["sold"] == UNITS
        shown = {
            name: await page.locator(field(name)).text_content()
            for name in ("total", "available", "held", "sold", "dead_letters")
        }
        assert shown == {
            "total": str(redis["total"]),
            "available": str(redis["available"]),
            "held": str(redis["held"]),
            "sold": str(redis["sold"]),
            "dead_letters": "0",
        }

        # One reconciler pass over the drained sale finds nothing; the reaper passes all along.
        reconciler, _ = build_worker(WorkerKind.RECONCILER, api.runtime, asyncio.Event())
        await reconciler.run_once()
        await expect(page.locator("#reconciler-drift")).to_have_text(
            "no drift", timeout=SEEN_WITHIN_MS
        )
        await expect(page.locator("#reaper-last-pass")).to_contain_text("s ago")

        # The purchases chart is drawn, and the request counters list the purchases.
        await expect(page.locator("#chart-purchases .uplot")).to_have_count(1)
        purchases = page.locator("#requests-body tr", has_text=PURCHASE_ROUTE).filter(
            has_text="reserved"
        )
        await expect(purchases).to_have_count(1)
        await expect(page.locator("#status")).to_be_empty()

        ARTIFACTS.mkdir(exist_ok=True)
        screenshot = ARTIFACTS / "dashboard.png"
        await page.screenshot(path=screenshot, full_page=True)

    assert screenshot.stat().st_size > 1000
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert errors == []
    outside = [url for url in requested if not url.startswith(api.http.base_url + "/")]
    assert outside == [], "the page must load nothing from elsewhere"


@pytest.mark.redis_variants("redis7", "cluster")
async def test_the_data_route_is_for_admins(served: Api) -> None:  # noqa: F811
    api = served
    route = "/api/v1/admin/dashboard"
    nobody = await api.http.get(route)
    assert (nobody.status_code, nobody.json()["error"]) == (401, "invalid_token"), nobody.text
    buyer = await api.http.get(route, headers=api.as_buyer("b-1"))
    assert (buyer.status_code, buyer.json()["error"]) == (403, "forbidden"), buyer.text

    item_id = await api.create_item(total=3)
    chosen = await api.http.get(f"{route}?item={item_id}&item=999", headers=api.as_admin)
    assert chosen.status_code == 200, chosen.text
    items = {i["item_id"]: i for i in chosen.json()["items"]}
    assert items.keys() == {item_id, 999}
    assert items[item_id]["redis"] == {"total": 3, "available": 3, "held": 0, "sold": 0}
    assert items[999]["redis"] is None


@pytest.mark.parametrize(
    ("who", "message"),
    [("buyer", "not an admin's"), ("garbage", "The token was refused")],
)
async def test_the_page_says_why_a_token_is_refused(
    served: Api,  # noqa: F811
    who: str,
    message: str,
) -> None:
    api = served
    token = api.token("b-1") if who == "buyer" else "not.a.jwt"
    async with chromium() as browser:
        page, _, errors = await open_page(browser, f"{api.http.base_url}/dashboard")
        await page.locator("#token").fill(token)
        await page.locator("#login button[type=submit]").click()
        await expect(page.locator("#status")).to_contain_text(message, timeout=SEEN_WITHIN_MS)
        await expect(page.locator("#status")).to_have_attribute("data-state", "error")
        # Asked again: the field is back, and the refused token is not kept.
        await expect(page.locator("#token")).to_be_visible()
        assert await page.evaluate("sessionStorage.length") == 0
    assert errors == []


async def test_the_page_needs_nothing_from_outside(served: Api) -> None:  # noqa: F811
    answer = await served.http.get("/dashboard")
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/html")
    page = answer.text
    assert re.findall(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page) == []
    # Every script and style is inline: no tag loads anything.
    assert re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=", page) == []
    assert "connect-src 'self'" in answer.headers["Content-Security-Policy"]
    paths = (await served.http.get("/openapi.json")).json()["paths"]
    assert "/dashboard" not in paths
    assert "/api/v1/admin/dashboard" in paths
