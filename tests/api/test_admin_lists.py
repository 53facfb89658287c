"""The operator's lists page: newest first, ``limit`` at a time, an opaque ``next_cursor`` (null
on the last page), the items by stage; a cursor or limit this API did not give is 422."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.redis_variants("redis7")

ITEMS = 250
SCHEDULED_EVERY = 10  # every tenth item's sale is still to start


async def listed(api: Api, path: str) -> dict[str, Any]:
    answer = await api.http.get(path, headers=api.as_admin)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def every_page(api: Api, query: str) -> tuple[list[int], list[int]]:
    """The item ids of every page, in order, and each page's length."""
    ids: list[int] = []
    sizes: list[int] = []
    cursor = ""
    while True:
        page = await listed(api, f"/api/v1/admin/items?{query}{cursor}")
        ids += [row["item_id"] for row in page["items"]]
        sizes.append(len(page["items"]))
        if page["next_cursor"] is None:
            return ids, sizes
        cursor = f"&cursor={page['next_cursor']}"


async def create(api: Api, n: int) -> int:
    starts_in = timedelta(hours=1) if n % SCHEDULED_EVERY == 0 else timedelta(minutes=-1)
    return await api.create_item(
        total=1, warm=False, starts_in=starts_in, ends_in=starts_in + timedelta(hours=1)
    )


async def test_250_items_page_newest_first(api: Api) -> None:
    created: list[int] = []
    scheduled: list[int] = []
    for first in range(0, ITEMS, 25):
        batch = range(first, first + 25)
        ids = await asyncio.gather(*(create(api, n) for n in batch))
        created += ids
        scheduled += [i for n, i in zip(batch, ids, strict=True) if n % SCHEDULED_EVERY == 0]
    created.sort()
    scheduled.sort()

    ids, sizes = await every_page(api, "limit=100")
    assert ids == created[::-1]  # each once, newest first
    assert sizes == [100, 100, 50]

    ids, sizes = await every_page(api, "stage=scheduled&limit=10")
    assert ids == scheduled[::-1]
    assert sizes == [10, 10, 5]
    on_sale, _ = await every_page(api, "stage=on_sale&limit=500")
    assert sorted(on_sale) == sorted(set(created) - set(scheduled))
    assert await listed(api, "/api/v1/admin/items?stage=archived") == {
        "items": [],
        "next_cursor": None,
    }

    first = await listed(api, "/api/v1/admin/items")  # 50 unless told
    assert [row["item_id"] for row in first["items"]] == created[::-1][:50]
    assert [row["stage"] == "scheduled" for row in first["items"]] == [
        i in scheduled for i in created[::-1][:50]
    ]
    assert first["next_cursor"] is not None


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("cursor=not-a-cursor!", "cursor"),
        ("cursor=eA", "cursor"),  # base64url of "x"
        ("cursor=LTE", "cursor"),  # "-1"
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=ten", "limit"),
        ("stage=sold", "stage"),
    ],
)
async def test_a_bad_cursor_limit_or_stage_is_refused(api: Api, query: str, complaint: str) -> None:
    for path in ("/api/v1/admin/items", "/api/v1/admin/refunds", "/api/v1/admin/dead-letters"):
        if complaint == "stage" and path != "/api/v1/admin/items":
            continue
        answer = await api.http.get(f"{path}?{query}", headers=api.as_admin)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["error"] == "invalid_request"
        assert complaint in answer.json()["message"], answer.text


async def test_dead_letters_page_newest_first(api: Api) -> None:
    for n in range(5):
        await api.runtime.ledger.add_dead_letter(
            stream="seckill:{1}:events", entry_id=f"{n + 1}-0", payload={"n": str(n)},
            error="cannot land", deliveries=3,
        )  # fmt: skip
    pages = []
    cursor = ""
    while True:
        page = await listed(api, f"/api/v1/admin/dead-letters?limit=2{cursor}")
        pages.append([letter["entry_id"] for letter in page["dead_letters"]])
        if page["next_cursor"] is None:
            break
        cursor = f"&cursor={page['next_cursor']}"
    assert pages == [["5-0", "4-0"], ["3-0", "2-0"], ["1-0"]]
    assert page["dead_letters"][0]["group"] == "persister"
    assert page["dead_letters"][0]["error"] == "cannot land"
