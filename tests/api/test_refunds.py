"""Refunds owed, from the charge to the operator: every success that paid nothing lands as one
refund row per payment, listed (paged, by item and state) over HTTP and by `seckill refunds`,
marked refunded once, shown on the dashboard and counted by the reconciler's gauge."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from seckill.services.reconcile.reconciler import Reconciler
from seckill.workers.reconciler import ReconcilerWorker
from tests.api.conftest import Api
from tests.api.test_metrics import scrape, value
from tests.support.seckill_cli import seckill

pytestmark = pytest.mark.redis_variants("redis7")


async def buy(api: Api, item_id: int, buyer: str) -> str:
    answer = await api.buy(item_id, buyer, f"{buyer}-key")
    assert answer.status_code == 202, answer.text
    return str(answer.json()["order_id"])


async def refunds(api: Api, query: str = "") -> dict[str, Any]:
    answer = await api.http.get(f"/api/v1/admin/refunds{query}", headers=api.as_admin)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def landed(api: Api, count: int) -> list[dict[str, Any]]:
    """The refunds, once ``count`` of them have landed in SQL."""
    for _ in range(200):
        found = (await refunds(api))["refunds"]
        if len(found) >= count:
            return list(found)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} refunds did not land: {found}")


async def test_refunds_owed_land_once_page_and_are_marked_once(served: Api, tmp_path: Path) -> None:
    item_id = await served.create_item(total=5)
    alice, bob, carol = [await buy(served, item_id, b) for b in ("alice", "bob", "carol")]
    assert (await served.pay(item_id, alice, "pay-1")).json()["outcome"] == "paid"
    for _ in range(3):  # a double click: charged twice, the provider repeats each notice
        assert (await served.pay(item_id, alice, "pay-2")).json()["refund_reason"] == (
            "duplicate_charge"
        )
    cancelled = await served.http.post(
        f"/api/v1/items/{item_id}/orders/{bob}/cancel", headers=served.as_buyer("bob")
    )
    assert cancelled.status_code == 200, cancelled.text
    late = await served.pay(item_id, bob, "pay/3:card")  # any visible id, slashes too
    assert late.json()["refund_reason"] == "cancelled"
    assert (await served.pay(item_id, carol, "pay-4", succeeded=False)).status_code == 200

    owed = await landed(served, 2)
    assert [(r["payment_id"], r["reason"], r["order_id"], r["state"]) for r in owed] == [
        ("pay/3:card", "cancelled", bob, "owed"),  # newest first
        ("pay-2", "duplicate_charge", alice, "owed"),
    ]
    assert {r["amount_cents"] for r in owed} == {19_900}

    first = await refunds(served, f"?item_id={item_id}&limit=1")
    assert [r["payment_id"] for r in first["refunds"]] == ["pay/3:card"]
    rest = await refunds(served, f"?item_id={item_id}&limit=1&cursor={first['next_cursor']}")
    assert [r["payment_id"] for r in rest["refunds"]] == ["pay-2"]
    assert rest["next_cursor"] is None
    assert (await refunds(served, f"?item_id={item_id + 1}"))["refunds"] == []

    path = f"/api/v1/admin/items/{item_id}/refunds/pay/3:card/refunded"
    marked = await served.http.post(path, headers=served.as_admin)
    assert marked.status_code == 200, marked.text
    assert marked.json()["state"] == "refunded"
    again = await served.http.post(path, headers=served.as_admin)
    assert again.json() == marked.json()  # idempotent: the first time stays
    assert [r["payment_id"] for r in (await refunds(served, "?state=owed"))["refunds"]] == ["pay-2"]
    assert [r["payment_id"] for r in (await refunds(served, "?state=refunded"))["refunds"]] == [
        "pay/3:card"
    ]
    unknown = await served.http.post(
        f"/api/v1/admin/items/{item_id}/refunds/pay-1/refunded", headers=served.as_admin
    )
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_refund")
    as_buyer = await served.http.get("/api/v1/admin/refunds", headers=served.as_buyer("alice"))
    assert as_buyer.status_code == 403

    dashboard = await served.http.get(
        f"/api/v1/admin/dashboard?item={item_id}", headers=served.as_admin
    )
    assert dashboard.json()["items"][0]["refunds_owed"] == {"count": 1, "amounts": {"USD": 19_900}}

    # The operator's command over the same stores.
    where = {
        "redis_url": served.settings.redis_url,
        "sql_url": served.settings.database_url,
        "data_dir": tmp_path,
        "redis_cluster": served.settings.redis_cluster,
    }
    listed = await asyncio.to_thread(
        seckill, "refunds", "list", "--item", str(item_id), "--state", "owed", "--json", **where
    )
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["payment_id"] for line in listed.stdout.splitlines()] == ["pay-2"]
    mark = await asyncio.to_thread(seckill, "refunds", "mark", str(item_id), "pay-2", **where)
    assert mark.returncode == 0, mark.stdout + mark.stderr
    assert "refunded at" in mark.stdout
    assert (await refunds(served, "?state=owed"))["refunds"] == []
    missing = await asyncio.to_thread(seckill, "refunds", "mark", str(item_id), "pay-1", **where)
    assert missing.returncode == 1
    assert "no refund is owed" in missing.stdout


async def test_a_refund_is_marked_by_its_payment_id_in_the_body_whatever_it_holds(
    served: Api,
) -> None:
    """Ids a path would change on the way (``.`` and ``..`` collapsed, ``%2F`` decoded, ``?x``
    cut off as a query) travel as they are in the body of ``POST /refunds/refunded``."""
    item_id = await served.create_item(total=5)
    order_id = await buy(served, item_id, "alice")
    ids = [".", "..", "a/b", "%2F", "?x"]
    for payment_id in ["charge", *ids]:  # the first pays; the others are owed back
        assert (await served.pay(item_id, order_id, payment_id)).status_code == 200
    await landed(served, len(ids))
    for payment_id in ids:
        body = {"item_id": item_id, "payment_id": payment_id}
        marked = await served.http.post(
            "/api/v1/admin/refunds/refunded", headers=served.as_admin, json=body
        )
        assert marked.status_code == 200, marked.text
        assert (marked.json()["payment_id"], marked.json()["state"]) == (payment_id, "refunded")
    assert (await refunds(served, "?state=owed"))["refunds"] == []
    unknown = await served.http.post(
        "/api/v1/admin/refunds/refunded",
        headers=served.as_admin,
        json={"item_id": item_id, "payment_id": "charge"},
    )
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_refund")
    as_buyer = await served.http.post(
        "/api/v1/admin/refunds/refunded",
        headers=served.as_buyer("alice"),
        json={"item_id": item_id, "payment_id": "."},
    )
    assert as_buyer.status_code == 403


async def test_each_reconciler_pass_counts_the_refunds_owed(served: Api) -> None:
    """``seckill_refunds_owed``: every refund not marked refunded yet, set by each pass."""
    runtime = served.runtime
    worker = ReconcilerWorker(
        reconciler=Reconciler(runtime.engine, runtime.ledger, grace_ms=5_000),
        redis=runtime.redis,
        scripts=runtime.engine.scripts,
        prefix=served.settings.key_prefix,
        interval_s=0,  # a full pass at every call
        repair=False,
        engine=runtime.engine,
    )

    async def owed_after_a_pass() -> float:
        await worker.run_once()
        return value(await scrape(served), "seckill_refunds_owed")

    assert await owed_after_a_pass() == 0
    item_id = await served.create_item(total=5)
    alice = await buy(served, item_id, "alice")
    assert (await served.pay(item_id, alice, "pay-1")).json()["outcome"] == "paid"
    for payment_id in ("pay-2", "pay-3"):  # charged twice more: two refunds owed
        paid = await served.pay(item_id, alice, payment_id)
        assert paid.json()["refund_reason"] == "duplicate_charge"
    await landed(served, 2)
    assert await owed_after_a_pass() == 2

    path = f"/api/v1/admin/items/{item_id}/refunds/pay-2/refunded"
    assert (await served.http.post(path, headers=served.as_admin)).status_code == 200
    assert await owed_after_a_pass() == 1
