"""Input rules, checked before anything touches Redis.

The Lua scripts enforce the same rules as a last guard (``engine/lua/_common.lua``); a test
feeds both the same inputs and checks they agree.
"""

from __future__ import annotations

import re
from typing import Any

from seckill.domain.outcomes import ErrorCode, InvalidRequest

MAX_ID = 2**63 - 1  # item and order ids fit a signed 64-bit SQL column
MAX_BUYER_LEN = 64
MAX_KEY_LEN = 255
MAX_REQUEST_ID_LEN = 64
MAX_PAYMENT_ID_LEN = 64
MIN_QUANTITY = 1
MAX_QUANTITY = 1_000_000
MAX_TOTAL = 10**12  # far below 2**53, where Lua numbers stop being exact
MAX_STOCK_SHARDS = 64
MAX_AMOUNT = 10**15 - 1  # minor units: 15 digits, exact in a Lua number (below 2**53)
# A currency is an ISO 4217 code: three capital letters (EUR, USD, JPY).
CURRENCY_PATTERN = r"^[A-Z]{3}$"
DEFAULT_CURRENCY = "USD"  # of an item created without one, unless SECKILL_CURRENCY says otherwise
# Times and deadlines (time + hold) stay within 14 digits: cjson stores numbers with 14
# significant digits, so a hold record's deadline is exact (until the year 4821).
MAX_TIME_MS = 90_000_000_000_000
MAX_HOLD_MS = 30 * 24 * 3600 * 1000


def _whole(value: Any, low: int, high: int) -> bool:
    # bool is an int subclass; True is not a quantity.
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")  # one C call: these run on every purchase


def _visible_ascii(value: Any, max_len: int) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= max_len
        and _VISIBLE_ASCII.fullmatch(value) is not None
    )


# C0 and C1 controls (NUL among them, which PostgreSQL refuses in text and SQLite keeps), and
# lone surrogates (a JSON "\ud800" escape), which no database's UTF-8 can store.
CONTROL_CHARACTERS = r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]"
_CONTROL = re.compile(CONTROL_CHARACTERS)


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds a character no name or id may: the one rule for free text (item
    names, dead letter ids, group names) wherever it comes from."""
    return _CONTROL.search(text) is not None


def check_item_id(item_id: Any) -> None:
    if not _whole(item_id, 1, MAX_ID):
        raise InvalidRequest(
            ErrorCode.INVALID_ITEM_ID, f"item id must be an integer from 1 to {MAX_ID}"
        )


def check_buyer(buyer: Any) -> None:
    if not _visible_ascii(buyer, MAX_BUYER_LEN):
        raise InvalidRequest(
            ErrorCode.INVALID_BUYER,
            f"buyer id must be 1 to {MAX_BUYER_LEN} visible ASCII characters",
        )


def check_idempotency_key(key: Any) -> None:
    if not _visible_ascii(key, MAX_KEY_LEN):
        raise InvalidRequest(
            ErrorCode.INVALID_KEY,
            f"idempotency key must be 1 to {MAX_KEY_LEN} visible ASCII characters",
        )


def check_request_id(request_id: Any) -> None:
    """Empty (none), or what a log line and an ``X-Request-Id`` header can carry as is."""
    if request_id != "" and not _visible_ascii(request_id, MAX_REQUEST_ID_LEN):
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST_ID,
            f"request id must be 1 to {MAX_REQUEST_ID_LEN} visible ASCII characters",
        )


def check_quantity(quantity: Any) -> None:
    """The one statement of a purchase's quantity rule: the engine holds every caller to it,
    and the API reads a purchase's body by it."""
    if not _whole(quantity, MIN_QUANTITY, MAX_QUANTITY):
        raise InvalidRequest(
            ErrorCode.INVALID_QUANTITY,
            f"quantity must be an integer from {MIN_QUANTITY} to {MAX_QUANTITY}",
        )


def check_order_id(order_id: Any) -> None:
    if not _whole(order_id, 1, MAX_ID):
        raise InvalidRequest(
            ErrorCode.INVALID_ORDER_ID, f"order id must be an integer from 1 to {MAX_ID}"
        )


def check_payment_id(payment_id: Any) -> None:
    if not _visible_ascii(payment_id, MAX_PAYMENT_ID_LEN):
        raise InvalidRequest(
            ErrorCode.INVALID_PAYMENT_ID,
            f"payment id must be 1 to {MAX_PAYMENT_ID_LEN} visible ASCII characters",
        )


def check_payment_result(succeeded: Any) -> None:
    # Strictly a bool: a truthy "failed" must never settle a payment as succeeded.
    if not isinstance(succeeded, bool):
        raise InvalidRequest(
            ErrorCode.INVALID_PAYMENT_RESULT, "payment result must be succeeded or failed"
        )


def check_amount(amount: Any) -> None:
    if not _whole(amount, 0, MAX_AMOUNT):
        raise InvalidRequest(
            ErrorCode.INVALID_AMOUNT,
            f"amount must be an integer from 0 to {MAX_AMOUNT} (minor units of the currency)",
        )


_CURRENCY = re.compile(CURRENCY_PATTERN)


def check_currency(currency: Any) -> None:
    if not (isinstance(currency, str) and _CURRENCY.fullmatch(currency)):
        raise InvalidRequest(
            ErrorCode.INVALID_CURRENCY, "currency must be an ISO 4217 code: three capital letters"
        )


def check_time_ms(now_ms: Any) -> None:
    if not _whole(now_ms, 1, MAX_TIME_MS):
        raise InvalidRequest(ErrorCode.INVALID_TIME, "time must be positive epoch milliseconds")


def check_batch(limit: Any) -> None:
    if not _whole(limit, 1, 10_000):
        raise InvalidRequest(ErrorCode.INVALID_BATCH, "batch limit must be from 1 to 10000")


def check_sale_item(
    *,
    total: Any,
    starts_at_ms: Any,
    ends_at_ms: Any,
    per_buyer_limit: Any,
    hold_ms: Any,
    stock_shards: Any = 1,
) -> None:
    problems = []
    if not _whole(stock_shards, 1, MAX_STOCK_SHARDS):
        problems.append(f"stock shards must be an integer from 1 to {MAX_STOCK_SHARDS}")
    if not _whole(total, 0, MAX_TOTAL):
        problems.append(f"total must be an integer from 0 to {MAX_TOTAL}")
    if not (_whole(starts_at_ms, 0, MAX_TIME_MS) and _whole(ends_at_ms, 1, MAX_TIME_MS)):
        problems.append("sale window must be epoch milliseconds")
    elif starts_at_ms >= ends_at_ms:
        problems.append("sale window must end after it starts")
    if not _whole(per_buyer_limit, 1, MAX_QUANTITY):
        problems.append(f"per-buyer limit must be an integer from 1 to {MAX_QUANTITY}")
    if not _whole(hold_ms, 1, MAX_HOLD_MS):
        problems.append(f"hold duration must be 1 to {MAX_HOLD_MS} ms")
    if problems:
        raise InvalidRequest(ErrorCode.INVALID_ITEM, "; ".join(problems))


def check_rate_limit(*, requests: Any, window_ms: Any) -> None:
    if not (_whole(requests, 1, MAX_QUANTITY) and _whole(window_ms, 1, MAX_HOLD_MS)):
        raise InvalidRequest(
            ErrorCode.INVALID_RATE_LIMIT,
            f"rate limit must be 1 to {MAX_QUANTITY} attempts per 1 to {MAX_HOLD_MS} ms",
        )
