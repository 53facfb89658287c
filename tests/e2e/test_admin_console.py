"""The operator's console in a real browser (the system Chromium, headless), against the API with
its persister and reaper: an item created, warmed, sold through the API, refused archiving while
on sale (the reasons shown), its sale ended early, then archived, each step seen on the page;
drift looked at and repaired, a dead letter replayed, a refund marked given back; a buyer's
token refused. Each change asks for confirmation first; the page loads nothing from outside the
server and puts the token in no address.

Screenshots (the sale, the item archived) are kept in ``test-artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.async_api import Locator, Page, expect
from redis.asyncio import Redis

from seckill.domain.ids import OrderIds
from seckill.security.tokens import Role
from seckill.store.ledger import Ledger
from tests.api.conftest import Api, served_api
from tests.conftest import RedisTarget
from tests.e2e.test_waiting_page import ARTIFACTS, assert_kept_to_itself, browser_page

# One Redis and one SQL backend: the page does not differ between them.
pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

SEEN_WITHIN_MS = 10_000
CREATE = "#create-form button[type=submit]"
# The page reads and writes times in the browser's zone: UTC, as this test fills them.
CONTEXT = {"timezone_id": "UTC", "viewport": {"width": 1280, "height": 1000}}


async def confirm(page: Page, action: str | Locator, says: str) -> None:
    """Click ``action`` (a selector or a locator), read what the confirmation asks, and agree."""
    await (page.locator(action) if isinstance(action, str) else action).click()
    await expect(page.locator("#confirm")).to_be_visible()
    await expect(page.locator("#confirm-text")).to_contain_text(says)
    await page.locator("#confirm-yes").click()
    await expect(page.locator("#confirm")).to_be_hidden()


@pytest.fixture
async def console_api(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    async with served_api(redis_server, sql_url, tmp_path) as live:
        yield live


def local(at: datetime) -> str:
    """``at`` as a datetime-local field takes it, in UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


async def test_an_item_from_creation_to_archive(console_api: Api) -> None:
    api = console_api
    token = api.token("ops", Role.ADMIN)
    async with browser_page(**CONTEXT) as (page, seen):
        await page.goto(f"{api.http.base_url}/admin#token={token}")
        assert "token" not in page.url  # taken out of the address bar
        await expect(page.locator("#items-empty")).to_be_visible()

        now = datetime.now(UTC)
        form = page.locator("#create-form")
        await form.locator("[name=name]").fill("Console lamp")
        await form.locator("[name=total]").fill("3")
        await form.locator("[name=per_buyer_limit]").fill("1")
        await form.locator("[name=starts_at]").fill(local(now - timedelta(seconds=1)))
        await form.locator("[name=ends_at]").fill(local(now + timedelta(hours=1)))
        await form.locator("[name=hold_seconds]").fill("60")
        # Cancelled: nothing is created.
        await page.locator(CREATE).click()
        await page.locator("#confirm-no").click()
        await expect(page.locator("#items-empty")).to_be_visible()
        assert await api.runtime.ledger.items() == []
        await confirm(page, CREATE, 'Create "Console lamp" with 3 units')

        row = page.locator("#items-body tr.item")
        await expect(row).to_have_count(1, timeout=SEEN_WITHIN_MS)
        item_id = int(await row.get_attribute("data-item-id") or 0)
        await expect(page.locator("#status")).to_have_text(
            f"Item {item_id} created. Warm it to put it on sale."
        )
        await expect(row.locator(".stage")).to_have_text("on_sale")
        await expect(page.locator("#item-id")).to_have_text(str(item_id))
        await expect(page.locator("#item-name")).to_have_text("Console lamp")
        await expect(page.locator("#item-card")).to_contain_text("sells directly")
        redis_row = page.locator("#counters-redis td")
        await expect(redis_row.nth(0)).to_have_text("-")  # not in Redis yet
        await expect(page.locator("#agree")).to_have_text("not in Redis: warm it to sell it")

        await confirm(page, "#warm", f"Warm item {item_id}")
        await expect(page.locator("#status")).to_have_text(f"Item {item_id} warmed: loaded.")
        await expect(redis_row).to_have_text(["3", "3", "0", "0"])

        # A small sale through the API: alice pays, bob cancels, carol holds until the end.
        orders = {}
        for buyer in ("alice", "bob", "carol"):
            bought = await api.buy(item_id, buyer, f"key-{buyer}")
            assert bought.status_code == 202, bought.text
            orders[buyer] = bought.json()["order_id"]
        assert (await api.pay(item_id, orders["alice"], "pay-alice")).status_code == 200
        cancelled = await api.http.post(
            f"/api/v1/items/{item_id}/orders/{orders['bob']}/cancel", headers=api.as_buyer("bob")
        )
        assert cancelled.status_code == 200, cancelled.text
        await expect(redis_row).to_have_text(["3", "1", "1", "1"], timeout=SEEN_WITHIN_MS)
        sql_row = page.locator("#counters-sql td")
        await expect(sql_row).to_have_text(["3", "1", "1", "1"], timeout=SEEN_WITHIN_MS)
        await expect(page.locator("#agree")).to_have_text("Redis and SQL agree")
        await page.screenshot(path=ARTIFACTS / "console-sale.png")

        # On sale: refused, with the reason, and nothing changes.
        await confirm(page, "#archive", f"Archive item {item_id}")
        await expect(page.locator("#status")).to_have_text(
            f"Item {item_id} is not settled: nothing changed."
        )
        await expect(page.locator("#item-result")).to_contain_text("not_ended")
        await expect(row.locator(".stage")).to_have_text("on_sale")
        await expect(row).to_contain_text("not_ended: the sale ends at")

        # The sale ended early, carol's hold still paid: settled.
        await confirm(page, "#end", f"End item {item_id}'s sale now?")
        await expect(page.locator("#status")).to_contain_text(f"Item {item_id}'s sale ended at")
        ended = await api.buy(item_id, "dave", "key-dave")
        assert ended.status_code == 403 and ended.json()["error"] == "ended", ended.text
        assert (await api.pay(item_id, orders["carol"], "pay-carol")).status_code == 200
        await expect(row.locator(".stage")).to_have_text("settled", timeout=SEEN_WITHIN_MS)
        await page.locator("#audit").click()
        await expect(page.locator("#item-result")).to_contain_text("Audit passed")
        await page.locator("#drift").click()
        await expect(page.locator("#item-result")).to_contain_text("No drift")
        await confirm(page, "#archive", f"Archive item {item_id}")
        await expect(page.locator("#status")).to_have_text(f"Item {item_id} archived.")
        await expect(page.locator("#item-stage")).to_have_text("archived")
        await expect(row.locator(".stage")).to_have_text("archived")
        await expect(redis_row.nth(0)).to_have_text("-")  # its keys left Redis
        await expect(page.locator("#agree")).to_have_text("archived: SQL keeps it")
        await expect(sql_row).to_have_text(["3", "1", "0", "2"])
        await page.screenshot(path=ARTIFACTS / "console-archived.png")

    assert seen.errors == []
    assert_kept_to_itself(api, seen, token)
    settlement = await api.runtime.ledger.archived_at(item_id)
    assert settlement is not None


async def test_drift_dead_letters_and_refunds(console_api: Api, redis: Redis) -> None:
    api = console_api
    item_id = await api.create_item(total=5)
    engine, ledger = api.runtime.engine, api.runtime.ledger
    # An entry the persister gave up on once (its SQL was away), kept aside as it would be.
    await engine.reserve(
        item_id, buyer="dora", quantity=1, idempotency_key="k", order_id=OrderIds(8).next()
    )
    [(entry_id, fields)] = [e for e in await engine.events(item_id) if e[1]["event"] == "reserved"]
    await ledger.add_dead_letter(
        stream=engine.keys(item_id).events, entry_id=entry_id, payload=fields,
        error="SQL timed out", deliveries=5,
    )  # fmt: skip
    # A second charge for a paid order: a refund owed.
    bought = await api.buy(item_id, "erin", "key-erin")
    assert bought.status_code == 202, bought.text
    order_id = bought.json()["order_id"]
    assert (await api.pay(item_id, order_id, "charge-1")).status_code == 200
    assert (await api.pay(item_id, order_id, "charge-2")).status_code == 200
    # And Redis's counters knocked off.
    await redis.hincrby(engine.keys(item_id).item, "held", 2)

    token = api.token("ops", Role.ADMIN)
    async with browser_page(**CONTEXT) as (page, seen):
        await page.goto(f"{api.http.base_url}/admin#token={token}")
        await page.locator(f"#items-body tr[data-item-id='{item_id}']").click()

        letter = page.locator("#letters-body tr")
        await expect(letter).to_have_count(1, timeout=SEEN_WITHIN_MS)
        await expect(letter).to_contain_text("SQL timed out")
        await letter.locator("input[type=checkbox]").check()
        await confirm(page, "#replay", "Replay 1 dead letter(s)?")
        await expect(page.locator("#letters-result")).to_contain_text("replayed")
        await expect(page.locator("#letters-empty")).to_be_visible()
        [replayed] = await ledger.dead_letters(include_settled=True)
        assert replayed.replayed_at is not None

        # The letter replayed, what is left is Redis's counters, knocked off: repaired.
        await page.locator("#drift").click()
        result = page.locator("#item-result")
        await expect(result).to_contain_text("Drift found")
        await expect(result).to_contain_text("redis_counters")
        await confirm(page, "#repair", f"Repair item {item_id}")
        await expect(result).to_contain_text("Repaired: Redis and SQL agree")
        assert {r.kind for r in await ledger.repairs(item_id)} == {"redis_counters"}

        refund = page.locator("#refunds-body tr")
        await expect(refund).to_have_count(1, timeout=SEEN_WITHIN_MS)
        await expect(refund).to_contain_text("charge-2")
        await expect(refund).to_contain_text("duplicate_charge")
        await confirm(page, refund.locator("button"), "Mark payment charge-2's refund")
        await expect(page.locator("#refunds-empty")).to_be_visible()
        await page.locator("#refund-state").select_option("refunded")
        await expect(refund).to_contain_text(re.compile("refunded [0-9]"))

    assert seen.errors == []
    assert_kept_to_itself(api, seen, token)


async def test_refunds_whose_payment_ids_a_path_would_lose_are_marked(console_api: Api) -> None:
    """Payment ids ``.`` and ``..``: a browser collapses such a path segment before sending
    (the mark went to another route: 404). The console names the payment in the body."""
    api = console_api
    item_id = await api.create_item(total=5)
    bought = await api.buy(item_id, "erin", "key-erin")
    assert bought.status_code == 202, bought.text
    order_id = bought.json()["order_id"]
    for payment_id in ("charge-1", ".", ".."):  # the first pays; the others are owed back
        assert (await api.pay(item_id, order_id, payment_id)).status_code == 200

    token = api.token("ops", Role.ADMIN)
    async with browser_page(**CONTEXT) as (page, seen):
        await page.goto(f"{api.http.base_url}/admin#token={token}")
        rows = page.locator("#refunds-body tr")
        await expect(rows).to_have_count(2, timeout=SEEN_WITHIN_MS)
        for payment_id in (".", ".."):
            row = page.locator(f"#refunds-body tr[data-payment-id='{payment_id}']")
            await confirm(page, row.locator("button"), f"Mark payment {payment_id}'s refund")
            await expect(page.locator("#status")).to_contain_text(
                f"Refund of payment {payment_id} marked given back."
            )
        await expect(page.locator("#refunds-empty")).to_be_visible()

    refunds = (await api.runtime.ledger.payments.refunds(item_id=item_id)).refunds
    assert {(r.payment_id, r.refunded_at is not None) for r in refunds} == {
        (".", True),
        ("..", True),
    }
    assert seen.errors == []
    assert_kept_to_itself(api, seen, token)


async def test_a_buyer_token_is_refused(console_api: Api) -> None:
    api = console_api
    item_id = await api.create_item(total=1)
    token = api.token("mallory")
    async with browser_page(**CONTEXT) as (page, seen):
        await page.goto(f"{api.http.base_url}/admin")
        await page.locator("#token").fill(token)
        await page.locator("#login button[type=submit]").click()
        await expect(page.locator("#status")).to_contain_text("This token is not an admin's")
        await expect(page.locator("#console")).to_be_hidden()
        await expect(page.locator("#token")).to_be_visible()
        assert await page.evaluate("sessionStorage.length") == 0
    refused = [r for _, r in seen.requests if "/api/v1/admin/" in r.url]
    assert refused  # it asked, and was told no
    assert all(r.method == "GET" for r in refused)  # and changed nothing
    assert await api.runtime.ledger.item(item_id) is not None
    assert_kept_to_itself(api, seen, token)
