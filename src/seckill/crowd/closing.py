"""A sale's last act, on the operators' console (``/admin``), in a real browser: the operator
ends each item's sale, waits for the console to list it settled (every hold paid or released,
every order landed, nothing in drift), archives it from the page, and the page is kept as a
screenshot. ``seckill demo`` ends with it, the screenshot beside its reports."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seckill.crowd.browser import CHROMIUM, CHROMIUM_ARGS
from seckill.crowd.client import ApiClient

SETTLED_WITHIN_S = 30  # after the end: the last holds expire and their releases land


class ClosingFailed(RuntimeError):
    """An item could not be ended or archived; the message says which and why."""


async def archive_on_console(client: ApiClient, item_ids: Sequence[int], screenshot: Path) -> None:
    """End each item's sale through the admin API, then archive it on the console once listed
    settled, and write the console as it then shows to ``screenshot``. Needs Chromium and
    Playwright (``seckill.crowd.browser.browser_missing`` says whether they are here)."""
    from playwright.async_api import async_playwright, expect

    for item_id in item_ids:
        ended = await client.end_sale(item_id)
        if ended.status != 200:
            raise ClosingFailed(f"item {item_id}: its sale did not end: {ended.body}")
    token = client.credentials.admin()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"{client.base_url}/admin#token={token}")
            for item_id in item_ids:
                row = page.locator(f"#items-body tr[data-item-id='{item_id}']")
                try:
                    await expect(row.locator(".stage")).to_have_text(
                        "settled", timeout=SETTLED_WITHIN_S * 1000
                    )
                except AssertionError:
                    held_by = await row.locator("td").last.text_content()
                    raise ClosingFailed(
                        f"item {item_id} was not settled within {SETTLED_WITHIN_S} s of its "
                        f"end: {held_by or 'not listed'}"
                    ) from None
                await row.click()
                await _ask_to_archive(page, expect)
                await page.locator("#confirm-yes").click()
                try:
                    await expect(row.locator(".stage")).to_have_text("archived")
                except AssertionError:
                    said = await page.locator("#item-result").text_content()
                    raise ClosingFailed(f"item {item_id} was not archived: {said}") from None
            await page.screenshot(path=screenshot, full_page=True)
        finally:
            await browser.close()


# A chosen item's details arrive after the click that chose it, a line of text above the buttons:
# a click made as they land hits where the button was. So the details are awaited first, and a
# click that opened nothing is made again, as an operator would.
ARCHIVE_CLICKS = 3


async def _ask_to_archive(page: Any, expect: Any) -> None:
    """Click the console's Archive until its confirmation is open."""
    await expect(page.locator("#item-card")).not_to_be_empty()
    for _ in range(ARCHIVE_CLICKS):
        await page.locator("#archive").click()
        try:
            await expect(page.locator("#confirm")).to_be_visible(timeout=10_000)
            return
        except AssertionError:
            continue  # the click landed as the details did: click again
    raise ClosingFailed(f"the console asked no confirmation after {ARCHIVE_CLICKS} Archive clicks")
