"""Payment notices: signed, fresh and applied once; forged, stale or tampered ones change
nothing; a payment for a hold already released becomes refund_required, never stock."""

from __future__ import annotations

import asyncio
import time

import pytest

from seckill.domain.holds import HoldState
from seckill.domain.money import Money
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from tests.api.conftest import Api
from tests.support.polling import wait_until

pytestmark = pytest.mark.redis_variants("redis7")


async def held_order(api: Api, *, hold_seconds: int = 60) -> tuple[int, str]:
    item_id = await api.create_item(total=5, hold_seconds=hold_seconds)
    answer = await api.buy(item_id, "alice", "k1")
    assert answer.status_code == 202, answer.text
    return item_id, answer.json()["order_id"]


async def state(api: Api, item_id: int, order_id: str) -> tuple[object, ...]:
    engine = api.runtime.engine
    hold = await engine.hold(item_id, int(order_id))
    stock = await engine.stock(item_id)
    # The last entry's id, not the length: the API's persister trims what it has landed.
    stream = await api.runtime.redis.xinfo_stream(engine.keys(item_id, 0).events)
    return hold, stock, stream["last-generated-id"]


async def test_a_signed_success_pays_the_hold_once(api: Api) -> None:
    item_id, order_id = await held_order(api)
    first = await api.pay(item_id, order_id, "pay-1")
    assert first.status_code == 200, first.text
    assert first.json() == {
        "payment_id": "pay-1",
        "item_id": item_id,
        "order_id": order_id,
        "outcome": "paid",
        "order_status": "paid",
        "refund_required": False,
        "refund_reason": None,
        "replayed": False,
    }
    before = await state(api, item_id, order_id)
    again = await api.pay(item_id, order_id, "pay-1")  # the provider retries its notice
    assert again.status_code == 200
    assert again.json() == {**first.json(), "replayed": True}
    assert await state(api, item_id, order_id) == before


@pytest.mark.parametrize(
    "tamper",
    ["wrong secret", "stale", "from the future", "body changed", "no signature", "garbage"],
)
async def test_forged_and_stale_notices_are_refused_and_change_nothing(
    api: Api, tamper: str
) -> None:
    item_id, order_id = await held_order(api)
    before = await state(api, item_id, order_id)
    notice: dict[str, str | int] = {
        "payment_id": "pay-x", "item_id": item_id, "order_id": order_id, "status": "succeeded"
    }  # fmt: skip
    tolerance = api.settings.payment_tolerance_seconds
    body, headers = api.signed(notice)
    if tamper == "wrong secret":
        body, headers = api.signed(notice, secret="not-the-shared-secret-" + "z" * 20)
    elif tamper == "stale":
        body, headers = api.signed(notice, at=time.time() - tolerance - 5)
    elif tamper == "from the future":
        body, headers = api.signed(notice, at=time.time() + tolerance + 5)
    elif tamper == "body changed":
        body = body.replace(b"succeeded", b"failed\x20\x20\x20")
    elif tamper == "no signature":
        del headers["Seckill-Signature"]
    else:
        headers["Seckill-Signature"] = "t=abc,v1=zz"
    answer = await api.http.post("/api/v1/payments/callback", content=body, headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"] == "invalid_signature"
    assert await state(api, item_id, order_id) == before
    hold, *_ = before
    assert hold.state is HoldState.HELD  # type: ignore[attr-defined]


async def test_a_replayed_notice_with_another_order_or_status_is_refused(api: Api) -> None:
    item_id, order_id = await held_order(api)
    assert (await api.pay(item_id, order_id, "pay-1")).status_code == 200
    before = await state(api, item_id, order_id)
    flipped = await api.pay(item_id, order_id, "pay-1", succeeded=False)
    assert flipped.status_code == 422, flipped.text
    assert flipped.json()["error"] == "payment_id_reused"
    assert await state(api, item_id, order_id) == before


async def test_failure_releases_and_a_late_success_requires_a_refund(api: Api) -> None:
    item_id, order_id = await held_order(api)
    failed = await api.pay(item_id, order_id, "pay-1", succeeded=False)
    assert failed.json()["outcome"] == "released"
    assert failed.json()["order_status"] == "released"
    stock_after_release = (await api.runtime.engine.stock(item_id),)
    late = await api.pay(item_id, order_id, "pay-2")  # out of order: the success arrives after
    assert late.status_code == 200, late.text
    assert late.json()["outcome"] == "refund_required"
    assert late.json()["refund_required"] is True
    assert late.json()["refund_reason"] == "payment_failed"
    assert (await api.runtime.engine.stock(item_id),) == stock_after_release  # no stock created
    seen = await api.http.get(
        f"/api/v1/items/{item_id}/orders/{order_id}", headers=api.as_buyer("alice")
    )
    assert seen.json()["status"] == "refund_required"


async def test_a_second_charge_for_a_paid_order_is_owed_back(api: Api) -> None:
    item_id, order_id = await held_order(api)
    assert (await api.pay(item_id, order_id, "pay-1")).json()["outcome"] == "paid"
    for replayed in (False, True):  # the provider retries the second charge's notice
        second = await api.pay(item_id, order_id, "pay-2")
        assert second.status_code == 200, second.text
        assert {k: second.json()[k] for k in ("outcome", "order_status", "refund_reason")} == {
            "outcome": "refund_required",
            "order_status": "paid",
            "refund_reason": "duplicate_charge",
        }
        assert (second.json()["refund_required"], second.json()["replayed"]) == (True, replayed)
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.sold == 1


async def test_one_payment_id_is_one_payment_of_its_item(api: Api) -> None:
    """A payment id names one payment of the item the notice names: the same id on two items
    is two payments (each item's own), and each retry replays its own answer."""
    first_item, first_order = await held_order(api)
    second_item = await api.create_item(total=5)
    second_order = (await api.buy(second_item, "bob", "k")).json()["order_id"]
    for _ in range(2):
        assert (await api.pay(first_item, first_order, "pay-1")).json()["outcome"] == "paid"
        assert (await api.pay(second_item, second_order, "pay-1")).json()["outcome"] == "paid"


async def test_a_failure_after_success_changes_nothing(api: Api) -> None:
    item_id, order_id = await held_order(api)
    assert (await api.pay(item_id, order_id, "pay-1")).json()["outcome"] == "paid"
    late_failure = await api.pay(item_id, order_id, "pay-2", succeeded=False)
    assert late_failure.json()["outcome"] == "already_paid"
    assert late_failure.json()["order_status"] == "paid"


async def test_a_charge_for_an_unknown_order_is_a_refund_owed_and_a_failure_404(
    api: Api,
) -> None:
    item_id = await api.create_item(total=1)
    failed = await api.pay(item_id, "123456789", "pay-0", succeeded=False)
    assert (failed.status_code, failed.json()["error"]) == (404, "unknown_order")
    charged = Money(1234, "EUR")
    answers = [await api.pay(item_id, "123456789", "pay-1", charged=charged) for _ in range(2)]
    for answer, replayed in zip(answers, (False, True), strict=True):
        assert answer.status_code == 200, answer.text
        assert answer.json() | {"replayed": replayed} == {
            "payment_id": "pay-1", "item_id": item_id, "order_id": "123456789",
            "outcome": "refund_required", "order_status": None, "refund_required": True,
            "refund_reason": "unknown_order", "replayed": replayed,
        }  # fmt: skip
    [refund] = (await api.http.get("/api/v1/admin/refunds", headers=api.as_admin)).json()["refunds"]
    assert {k: refund[k] for k in ("order_id", "buyer", "quantity", "amount_cents")} == {
        "order_id": "123456789", "buyer": None, "quantity": None, "amount_cents": 1234,
    }  # fmt: skip
    assert (refund["currency"], refund["reason"]) == ("EUR", "unknown_order")


async def test_a_notice_naming_another_item_is_a_refund_owed_there_and_changes_the_order_not(
    api: Api,
) -> None:
    item_id, order_id = await held_order(api)
    other = await api.create_item(total=5)
    before = await state(api, item_id, order_id)
    answer = await api.pay(other, order_id, "pay-1")
    assert answer.status_code == 200, answer.text
    assert (answer.json()["refund_reason"], answer.json()["order_status"]) == (
        "unknown_order", None
    )  # fmt: skip
    assert await state(api, item_id, order_id) == before
    # The notice under its own item still pays, once (the reconciler reports the payment id
    # on two items: one charge, recorded twice).
    assert (await api.pay(item_id, order_id, "pay-1")).json()["outcome"] == "paid"


async def test_a_charge_for_an_order_redis_lost_but_sql_holds_waits_for_it(api: Api) -> None:
    """Never unknown: an order SQL holds that no shard holds was lost by Redis (a rewind, a
    failover) and comes back with recovery; its charge is 503 item_recovering meanwhile, and
    nothing is owed or recorded."""
    item_id, order_id = await held_order(api)

    async def landed() -> bool:
        return await api.runtime.ledger.order(int(order_id)) is not None

    await wait_until(landed, 10, "the order in SQL")
    keys = item_keys(item_id, DEFAULT_PREFIX)
    await api.runtime.redis.hdel(keys.holds, order_id)  # as a Redis that lost its last writes
    answer = await api.pay(item_id, order_id, "pay-1")
    assert (answer.status_code, answer.json()["error"]) == (503, "item_recovering"), answer.text
    assert answer.headers["Retry-After"] == "1"
    assert not await api.runtime.redis.hexists(keys.payments, "pay-1")
    assert (await api.runtime.ledger.payments.refunds(item_id=item_id)).refunds == []


@pytest.mark.parametrize(
    ("charged", "reason"),
    [
        (Money(19_899, "USD"), "amount_mismatch"),  # one cent short
        (Money(19_901, "USD"), "amount_mismatch"),  # one cent over
        (Money(19_900, "EUR"), "currency_mismatch"),
    ],
)
async def test_a_wrong_sum_is_a_refund_owed_of_it_and_the_order_stays_payable(
    api: Api, charged: Money, reason: str
) -> None:
    item_id, order_id = await held_order(api)
    for replayed in (False, True):
        wrong = await api.pay(item_id, order_id, "wrong", charged=charged)
        assert wrong.status_code == 200, wrong.text
        assert {k: wrong.json()[k] for k in ("outcome", "order_status", "refund_reason")} == {
            "outcome": "refund_required", "order_status": "held", "refund_reason": reason,
        }  # fmt: skip
        assert wrong.json()["replayed"] is replayed
    right = await api.pay(item_id, order_id, "right")
    assert (right.json()["outcome"], right.json()["order_status"]) == ("paid", "paid")
    [refund] = (await api.http.get("/api/v1/admin/refunds", headers=api.as_admin)).json()["refunds"]
    assert (refund["payment_id"], refund["amount_cents"], refund["currency"]) == (
        "wrong", charged.cents, charged.currency
    )  # fmt: skip


async def test_a_payment_after_the_deadline_is_refunded_not_sold(api: Api) -> None:
    item_id, order_id = await held_order(api, hold_seconds=1)
    await asyncio.sleep(1.2)
    late = await api.pay(item_id, order_id, "pay-1")
    assert late.json()["outcome"] == "refund_required"
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held, stock.sold) == (5, 0, 0)
