from __future__ import annotations

from typing import Any

import pytest

from seckill.domain import rules
from seckill.domain.items import SaleItem, Stock
from seckill.domain.outcomes import ErrorCode, InvalidRequest

BAD_BUYERS = ["", "x" * 65, "has space", "tab\t", "naïve", None, 42]
BAD_KEYS = ["", "k" * 256, "new\nline", b"bytes"]
BAD_QUANTITIES = [0, -1, rules.MAX_QUANTITY + 1, 1.5, "2", True, None]
BAD_IDS = [0, -5, 2**63, "12", 3.0, False]


@pytest.mark.parametrize("buyer", BAD_BUYERS)
def test_bad_buyer(buyer: Any) -> None:
    with pytest.raises(InvalidRequest) as err:
        rules.check_buyer(buyer)
    assert err.value.code is ErrorCode.INVALID_BUYER


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_idempotency_key(key: Any) -> None:
    with pytest.raises(InvalidRequest) as err:
        rules.check_idempotency_key(key)
    assert err.value.code is ErrorCode.INVALID_KEY


@pytest.mark.parametrize("quantity", BAD_QUANTITIES)
def test_bad_quantity(quantity: Any) -> None:
    with pytest.raises(InvalidRequest) as err:
        rules.check_quantity(quantity)
    assert err.value.code is ErrorCode.INVALID_QUANTITY


@pytest.mark.parametrize("value", BAD_IDS)
def test_bad_ids(value: Any) -> None:
    with pytest.raises(InvalidRequest, match="invalid_item_id"):
        rules.check_item_id(value)
    with pytest.raises(InvalidRequest, match="invalid_order_id"):
        rules.check_order_id(value)


def test_good_values_pass() -> None:
    rules.check_buyer("auth0|user-42@example.com")
    rules.check_idempotency_key("0b4e7c1e-8f9a-4c1b-9d7e-2f4a6b8c0d1e")
    rules.check_quantity(rules.MAX_QUANTITY)
    rules.check_order_id(2**63 - 1)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("total", -1, "total"),
        ("per_buyer_limit", 0, "per-buyer limit"),
        ("hold_ms", 0, "hold duration"),
        ("ends_at_ms", 1_000, "end after it starts"),
        ("starts_at_ms", "soon", "epoch milliseconds"),
    ],
)
def test_a_bad_sale_item_names_what_is_wrong(field: str, value: Any, says: str) -> None:
    good = dict(
        item_id=1, total=10, starts_at_ms=1_000, ends_at_ms=2_000, per_buyer_limit=1, hold_ms=1
    )
    with pytest.raises(InvalidRequest, match=says) as err:
        SaleItem(**{**good, field: value})
    assert err.value.code is ErrorCode.INVALID_ITEM


def test_stock_balance() -> None:
    assert Stock(total=10, available=3, held=2, sold=5).balanced
    assert not Stock(total=10, available=4, held=2, sold=5).balanced
    assert not Stock(total=0, available=-1, held=1, sold=0).balanced
