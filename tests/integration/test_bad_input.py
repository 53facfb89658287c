"""Bad input gets a clear error and changes nothing: the item's keys stay byte-identical.

Python refuses first (``InvalidRequest`` before any round trip); the scripts refuse again as a
last guard, which is checked by calling them raw with what Python would never send.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from seckill.domain import rules
from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX, item_pattern
from seckill.engine.scripts import ScriptName, Scripts
from seckill.redis_server import RedisServer
from tests.conftest import open_item, pay

ids = OrderIds(4)


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A client that reads bytes, for DUMP."""
    async with Redis.from_url(redis_server.url) as client:
        yield client


async def snapshot(raw: Redis) -> dict[bytes, bytes]:
    """Every key of item 1, serialized by Redis itself."""
    keys = sorted([k async for k in raw.scan_iter(match=item_pattern(1, DEFAULT_PREFIX))])
    assert keys, "the snapshot found no keys to compare"
    return {k: await raw.dump(k) for k in keys}


@pytest.fixture
async def busy_item(engine: RedisEngine) -> int:
    """Item 1 with a hold, a payment and a release behind it, so every key exists."""
    await engine.load_item(open_item(total=10, limit=2))
    held, paid, released = [
        await engine.reserve(1, buyer=b, quantity=1, idempotency_key="k", order_id=ids.next())
        for b in ("held", "paid", "released")
    ]
    assert paid.order_id and released.order_id and held.order_id
    await pay(engine, 1, paid.order_id)
    await engine.release(1, released.order_id, "cancelled")  # type: ignore[arg-type]
    return held.order_id


GOOD = dict(buyer="alice", quantity=1, idempotency_key="key-1")
BAD_RESERVES: list[tuple[dict[str, Any], ErrorCode]] = [
    ({"quantity": 0}, ErrorCode.INVALID_QUANTITY),
    ({"quantity": -3}, ErrorCode.INVALID_QUANTITY),
    ({"quantity": "2"}, ErrorCode.INVALID_QUANTITY),
    ({"quantity": 2.5}, ErrorCode.INVALID_QUANTITY),
    ({"buyer": ""}, ErrorCode.INVALID_BUYER),
    ({"buyer": "b" * 65}, ErrorCode.INVALID_BUYER),
    ({"buyer": "two words"}, ErrorCode.INVALID_BUYER),
    ({"idempotency_key": ""}, ErrorCode.INVALID_KEY),
    ({"idempotency_key": "k" * 256}, ErrorCode.INVALID_KEY),
    ({"order_id": 0}, ErrorCode.INVALID_ORDER_ID),
    ({"order_id": "12"}, ErrorCode.INVALID_ORDER_ID),
    ({"order_id": 2**63}, ErrorCode.INVALID_ORDER_ID),
    ({"request_id": "r" * 65}, ErrorCode.INVALID_REQUEST_ID),
    ({"request_id": "two words"}, ErrorCode.INVALID_REQUEST_ID),
]


@pytest.mark.parametrize(("change", "code"), BAD_RESERVES)
async def test_bad_reserve_changes_nothing(
    engine: RedisEngine, raw: Redis, busy_item: int, change: dict[str, Any], code: ErrorCode
) -> None:
    before = await snapshot(raw)
    with pytest.raises(InvalidRequest) as err:
        await engine.reserve(1, **{"order_id": ids.next(), **GOOD, **change})
    assert err.value.code is code
    assert await snapshot(raw) == before


async def test_lua_only_refusals_change_nothing(
    engine: RedisEngine, raw: Redis, busy_item: int
) -> None:
    """Rules that need the item's state: the script alone can refuse them."""
    before = await snapshot(raw)
    with pytest.raises(InvalidRequest) as above:
        await engine.reserve(1, **{**GOOD, "quantity": 3}, order_id=ids.next())
    assert above.value.code is ErrorCode.QUANTITY_ABOVE_LIMIT
    with pytest.raises(InvalidRequest) as duplicate:
        await engine.reserve(1, **GOOD, order_id=busy_item)
    assert duplicate.value.code is ErrorCode.DUPLICATE_ORDER_ID
    with pytest.raises(InvalidRequest) as active:
        await engine.load_item(open_item(total=1))
    assert active.value.code is ErrorCode.ITEM_ACTIVE
    assert await snapshot(raw) == before


async def test_bad_payment_release_expire_change_nothing(
    engine: RedisEngine, raw: Redis, busy_item: int
) -> None:
    before = await snapshot(raw)
    for call, code in [
        (pay(engine, 1, -1), ErrorCode.INVALID_ORDER_ID),
        (pay(engine, 0, busy_item), ErrorCode.INVALID_ITEM_ID),
        (engine.release(1, busy_item, "lost"), ErrorCode.INVALID_REASON),  # type: ignore[arg-type]
        (engine.expire_due(1, limit=0), ErrorCode.INVALID_BATCH),
    ]:
        with pytest.raises((InvalidRequest, ValueError)) as err:
            await call
        if isinstance(err.value, InvalidRequest):
            assert err.value.code is code
    assert await snapshot(raw) == before


# What Python never sends: the scripts must still refuse it, writing nothing.
ITEM, BUYER, QTY, ORDER, TTL, NOW = "1", "alice", "1", "777", "60000", ""
TOO_BIG = str(2**63)
SUM = ("100", "USD")  # a charge (and an item's price): a notice's own arguments
RAW: list[tuple[ScriptName, tuple[str, ...], ErrorCode]] = [
    (ScriptName.RESERVE, ("01", BUYER, QTY, ORDER, TTL, NOW), ErrorCode.INVALID_ITEM_ID),
    (ScriptName.RESERVE, (ITEM, "", QTY, ORDER, TTL, NOW), ErrorCode.INVALID_BUYER),
    (ScriptName.RESERVE, (ITEM, "a\x00b", QTY, ORDER, TTL, NOW), ErrorCode.INVALID_BUYER),
    (ScriptName.RESERVE, (ITEM, BUYER, "0", ORDER, TTL, NOW), ErrorCode.INVALID_QUANTITY),
    (ScriptName.RESERVE, (ITEM, BUYER, "-1", ORDER, TTL, NOW), ErrorCode.INVALID_QUANTITY),
    (ScriptName.RESERVE, (ITEM, BUYER, "1.5", ORDER, TTL, NOW), ErrorCode.INVALID_QUANTITY),
    (ScriptName.RESERVE, (ITEM, BUYER, "01", ORDER, TTL, NOW), ErrorCode.INVALID_QUANTITY),
    (ScriptName.RESERVE, (ITEM, BUYER, "1e3", ORDER, TTL, NOW), ErrorCode.INVALID_QUANTITY),
    (ScriptName.RESERVE, (ITEM, BUYER, "nan", ORDER, TTL, NOW), ErrorCode.INVALID_QUANTITY),
    (ScriptName.RESERVE, (ITEM, BUYER, QTY, TOO_BIG, TTL, NOW), ErrorCode.INVALID_ORDER_ID),
    (ScriptName.RESERVE, (ITEM, BUYER, QTY, "0x10", TTL, NOW), ErrorCode.INVALID_ORDER_ID),
    (ScriptName.RESERVE, (ITEM, BUYER, QTY, ORDER, "0", NOW), ErrorCode.INVALID_TTL),
    (ScriptName.RESERVE, (ITEM, BUYER, QTY, ORDER, TTL, "yesterday"), ErrorCode.INVALID_TIME),
    (ScriptName.RELEASE, (ITEM, ORDER, "", NOW), ErrorCode.INVALID_REASON),
    (ScriptName.RELEASE, (ITEM, ORDER, "Cancelled", NOW), ErrorCode.INVALID_REASON),
    (ScriptName.EXPIRE_DUE, (ITEM, NOW, "10001"), ErrorCode.INVALID_BATCH),
    (ScriptName.EXPIRE_DUE, (ITEM, NOW, ""), ErrorCode.INVALID_BATCH),
    (ScriptName.LOAD_ITEM, (ITEM, "-1", "0", "10", "1", "1", "0", NOW), ErrorCode.INVALID_ITEM),
    (ScriptName.LOAD_ITEM, (ITEM, "5", "10", "10", "1", "1", "0", NOW), ErrorCode.INVALID_ITEM),
    (ScriptName.LOAD_ITEM, (ITEM, "5", "0", "10", "0", "1", "0", NOW), ErrorCode.INVALID_ITEM),
    (ScriptName.LOAD_ITEM, (ITEM, "5", "0", "10", "1", "0", "0", NOW), ErrorCode.INVALID_ITEM),
    # forced, but the new total 1 is below the 2 units held and paid
    (ScriptName.LOAD_ITEM, (ITEM, "1", "0", "10", "1", "1", "1", NOW),
     ErrorCode.TOTAL_BELOW_COMMITTED),
    (ScriptName.SETTLE_PAYMENT, (ITEM, "0", "pay-1", "failed", *SUM, NOW, *SUM),
     ErrorCode.INVALID_ORDER_ID),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "", "failed", *SUM, NOW, *SUM),
     ErrorCode.INVALID_PAYMENT_ID),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "p" * 65, "failed", *SUM, NOW, *SUM),
     ErrorCode.INVALID_PAYMENT_ID),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay 1", "failed", *SUM, NOW, *SUM),
     ErrorCode.INVALID_PAYMENT_ID),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "", *SUM, NOW, *SUM),
     ErrorCode.INVALID_PAYMENT_RESULT),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "Failed", *SUM, NOW, *SUM),
     ErrorCode.INVALID_PAYMENT_RESULT),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "failed", *SUM, "0", *SUM),
     ErrorCode.INVALID_TIME),
    (ScriptName.SETTLE_PAYMENT, (ITEM, "abc", "pay-1", "succeeded", *SUM, NOW, *SUM),
     ErrorCode.INVALID_ORDER_ID),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "succeeded", *SUM, "-5", *SUM),
     ErrorCode.INVALID_TIME),
    (ScriptName.CLAIM_PAYMENT, (ITEM, ORDER, "pay-1", "succeeded", *SUM, "0"),
     ErrorCode.INVALID_SHARD),
    (ScriptName.CLAIM_PAYMENT, (ITEM, ORDER, "pay-1", "succeeded", *SUM, "64"),
     ErrorCode.INVALID_SHARD),
    (ScriptName.CLAIM_PAYMENT, (ITEM, ORDER, "pay 1", "succeeded", *SUM, "1"),
     ErrorCode.INVALID_PAYMENT_ID),
    (ScriptName.CLAIM_PAYMENT, (ITEM, "0", "pay-1", "succeeded", *SUM, "1"),
     ErrorCode.INVALID_ORDER_ID),
    (ScriptName.CLAIM_PAYMENT, (ITEM, ORDER, "pay-1", "paid", *SUM, "1"),
     ErrorCode.INVALID_PAYMENT_RESULT),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "failed", "-1", "USD", NOW, *SUM),
     ErrorCode.INVALID_AMOUNT),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "failed", "1000000000000000", "USD", NOW,
     *SUM), ErrorCode.INVALID_AMOUNT),
    (ScriptName.SETTLE_PAYMENT, (ITEM, ORDER, "pay-1", "failed", "100", "usd", NOW, *SUM),
     ErrorCode.INVALID_CURRENCY),
    (ScriptName.CLAIM_PAYMENT, (ITEM, ORDER, "pay-1", "failed", "1.5", "USD", "1"),
     ErrorCode.INVALID_AMOUNT),
    (ScriptName.CLAIM_PAYMENT, (ITEM, ORDER, "pay-1", "failed", "100", "EURO", "1"),
     ErrorCode.INVALID_CURRENCY),
    (ScriptName.REPLAY_REFUNDS, (ITEM, NOW, "pay 1"), ErrorCode.INVALID_PAYMENT_ID),
    (ScriptName.REPLAY_REFUNDS, (ITEM, "x"), ErrorCode.INVALID_TIME),
]  # fmt: skip


@pytest.mark.parametrize(("script", "args", "code"), RAW)
async def test_scripts_refuse_raw_bad_input(
    engine: RedisEngine,
    scripts: Scripts,
    raw: Redis,
    busy_item: int,
    script: ScriptName,
    args: tuple[str, ...],
    code: ErrorCode,
) -> None:
    keys = engine.keys(1)
    all_keys = keys.all_fixed()
    if script is ScriptName.RESERVE:
        all_keys = (*all_keys, keys.idempotency(BUYER, "raw"))
    if script in (ScriptName.SETTLE_PAYMENT, ScriptName.CLAIM_PAYMENT, ScriptName.REPLAY_REFUNDS):
        all_keys = (*all_keys, keys.payments)
        args = (args[0], str(busy_item), *args[2:]) if args[1] == ORDER else args  # a real hold
    before = await snapshot(raw)
    with pytest.raises(InvalidRequest) as err:
        await scripts.call(script, all_keys, args)
    assert err.value.code is code
    assert await snapshot(raw) == before


async def _lua_refusal(engine: RedisEngine, scripts: Scripts, buyer: str, quantity: str) -> Any:
    keys = engine.keys(1)
    args = ("1", buyer, quantity, str(ids.next()), "60000", "")
    try:
        # Item 1 is not loaded: valid input answers unknown_item and writes nothing.
        await scripts.call(
            ScriptName.RESERVE, (*keys.all_fixed(), keys.idempotency("x", "y")), args
        )
    except InvalidRequest as exc:
        return exc.code
    return None


async def _lua_payment_refusal(
    engine: RedisEngine,
    scripts: Scripts,
    payment_id: str,
    amount: str = "100",
    currency: str = "USD",
) -> Any:
    keys = engine.keys(1)
    args = ("1", str(ids.next()), payment_id, "failed", amount, currency, "", "100", "USD")
    try:
        # No such hold: a valid failure answers unknown_order and writes nothing.
        await scripts.call(ScriptName.SETTLE_PAYMENT, (*keys.all_fixed(), keys.payments), args)
    except InvalidRequest as exc:
        return exc.code
    return None


def _python_refuses(check: Any, value: Any) -> bool:
    try:
        check(value)
    except InvalidRequest:
        return True
    return False


AGREEMENT = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ANY_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=70)
ASCII_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=70)


@AGREEMENT
@given(buyer=ANY_TEXT | ASCII_TEXT)
async def test_python_and_lua_agree_on_buyers(
    engine: RedisEngine, scripts: Scripts, buyer: str
) -> None:
    refused = await _lua_refusal(engine, scripts, buyer, "1")
    assert (refused is ErrorCode.INVALID_BUYER) == _python_refuses(rules.check_buyer, buyer)


@AGREEMENT
@given(quantity=st.integers(min_value=-5, max_value=rules.MAX_QUANTITY + 5) | st.integers())
async def test_python_and_lua_agree_on_quantities(
    engine: RedisEngine, scripts: Scripts, quantity: int
) -> None:
    refused = await _lua_refusal(engine, scripts, "alice", str(quantity))
    assert (refused is ErrorCode.INVALID_QUANTITY) == _python_refuses(
        rules.check_quantity, quantity
    )


@AGREEMENT
@given(payment_id=ANY_TEXT | ASCII_TEXT)
async def test_python_and_lua_agree_on_payment_ids(
    engine: RedisEngine, scripts: Scripts, payment_id: str
) -> None:
    refused = await _lua_payment_refusal(engine, scripts, payment_id)
    assert (refused is ErrorCode.INVALID_PAYMENT_ID) == _python_refuses(
        rules.check_payment_id, payment_id
    )


@AGREEMENT
@given(amount=st.integers(min_value=-5, max_value=rules.MAX_AMOUNT + 5) | st.integers())
async def test_python_and_lua_agree_on_amounts(
    engine: RedisEngine, scripts: Scripts, amount: int
) -> None:
    refused = await _lua_payment_refusal(engine, scripts, "pay-1", amount=str(amount))
    assert (refused is ErrorCode.INVALID_AMOUNT) == _python_refuses(rules.check_amount, amount)


@AGREEMENT
@given(currency=st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=4))
async def test_python_and_lua_agree_on_currencies(
    engine: RedisEngine, scripts: Scripts, currency: str
) -> None:
    refused = await _lua_payment_refusal(engine, scripts, "pay-1", currency=currency)
    assert (refused is ErrorCode.INVALID_CURRENCY) == _python_refuses(
        rules.check_currency, currency
    )
