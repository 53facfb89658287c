"""The lean routes read its request as the framework would: the same bearer tokens, the same
bodies accepted and refused, the same idempotency keys."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.security import HTTPBearer
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from seckill.api.auth import bearer_token
from seckill.api.buyers import _quantity, held_body, idempotency_key
from seckill.api.errors import ApiError
from seckill.api.lean_routes import _item_id
from seckill.api.paths import PURCHASE_PATH
from seckill.api.schemas import ReservationOut
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import InvalidRequest
from seckill.domain.rules import MAX_ID, MAX_QUANTITY, check_quantity
from seckill.domain.times import ms_to_datetime

AUTHORIZATIONS = [
    None, "", "Bearer abc", "bearer abc", "BEARER abc", "Bearer  abc  ", "Bearer", "Bearer ",
    "Basic abc", "Bearerabc", " Bearer abc", "Bearer a b", "Token abc",
]  # fmt: skip


@pytest.mark.parametrize("authorization", AUTHORIZATIONS)
def test_a_bearer_token_is_read_as_the_framework_reads_it(authorization: str | None) -> None:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    request = Request({"type": "http", "headers": headers})
    credentials = asyncio.run(HTTPBearer(auto_error=False)(request))
    expected = credentials.credentials if credentials else None
    assert bearer_token(authorization) == expected


@pytest.mark.parametrize(
    ("body", "content_type", "quantity"),
    [
        (b"", None, 1),
        (b"", b"text/plain", 1),  # no body: nothing to read, whatever it says it is
        (b'{"quantity": 3}', b"application/json", 3),
        (b'{"quantity": 3}', b"Application/JSON", 3),
        (b'{"quantity": 3}', b"application/json; charset=utf-8", 3),
        (b'{"quantity": 3}', b'application/json;charset="UTF-8"', 3),
        (b'{"quantity": 3}', b"application/json;", 3),
    ],
)
def test_bodies_that_buy(body: bytes, content_type: bytes | None, quantity: int) -> None:
    assert _quantity(body, content_type).quantity == quantity


JSON = b"application/json"
QUANTITY_3 = '{"quantity": 3}'
# The domain's rule says it (seckill.domain.rules.check_quantity), for the body as for the engine.
NOT_A_QUANTITY = f"body.quantity: quantity must be an integer from 1 to {MAX_QUANTITY}"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"quantity": 0}', NOT_A_QUANTITY),
        (f'{{"quantity": {MAX_QUANTITY + 1}}}'.encode(), NOT_A_QUANTITY),
        (b'{"quantity": 1.5}', NOT_A_QUANTITY),
        (b'{"quantity": null}', NOT_A_QUANTITY),
        # Strict: a JSON integer, and each key once (a first-key reader would buy 1).
        (b'{"quantity": "3"}', NOT_A_QUANTITY),
        (b'{"quantity": true}', NOT_A_QUANTITY),
        (b'{"quantity": 1.0}', NOT_A_QUANTITY),
        (b'{"quantity": 1, "quantity": 3}', "body.quantity: given twice"),
        (b'{"quantity": 1, "price": 0}', "body.price: Extra inputs are not permitted"),
        (b"[1, 2]", "body: Input should be a valid dictionary"),
        (b"{not json", "body: not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, "body: not valid JSON"),
        # UTF-8 only, read strictly: json.loads(bytes) would guess the others and buy 3.
        (b"\xff{}", "body: not UTF-8"),
        (QUANTITY_3.encode("utf-16"), "body: not UTF-8 (UTF-16 is refused)"),
        (QUANTITY_3.encode("utf-16-le"), "body: not UTF-8 (UTF-16 is refused)"),
        (QUANTITY_3.encode("utf-16-be"), "body: not UTF-8 (UTF-16 is refused)"),
        (QUANTITY_3.encode("utf-32"), "body: not UTF-8 (UTF-32 is refused)"),
        (QUANTITY_3.encode("utf-32-le"), "body: not UTF-8 (UTF-32 is refused)"),
        (QUANTITY_3.encode("utf-32-be"), "body: not UTF-8 (UTF-32 is refused)"),
        (QUANTITY_3.encode("utf-8-sig"), "body: UTF-8 with a byte order mark"),
        (b'{"quantity": 3\xc0\xaf}', "body: not UTF-8"),  # an overlong "/"
    ],
)
def test_bodies_that_are_refused(body: bytes, says: str) -> None:
    with pytest.raises(ApiError) as refused:
        _quantity(body, JSON)
    assert (refused.value.status, refused.value.code) == (422, "invalid_request")
    assert refused.value.message.startswith(says), refused.value.message


@given(
    st.integers(-2, MAX_QUANTITY + 2)
    | st.integers()
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.none()
    | st.text(max_size=3)
)
def test_a_body_quantity_is_read_by_the_domains_rule(sent: object) -> None:
    body = json.dumps({"quantity": sent}).encode()
    quantity = json.loads(body)["quantity"]  # what the body says, as it is read
    try:
        check_quantity(quantity)
    except InvalidRequest:
        with pytest.raises(ApiError) as refused:
            _quantity(body, JSON)
        assert refused.value.message == NOT_A_QUANTITY
    else:
        assert _quantity(body, JSON).quantity == quantity


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        b"text/plain",
        b"application/x-www-form-urlencoded",
        b"application/vnd.seckill+json",
        b"application/jsonx",
        b"application/json; charset=utf-16",
        b"application/json; charset=latin-1",
        b"application/json; boundary=x",
    ],
)
def test_a_body_not_sent_as_json_in_utf8_is_a_415(content_type: bytes | None) -> None:
    with pytest.raises(ApiError) as refused:
        _quantity(b'{"quantity": 3}', content_type)
    assert (refused.value.status, refused.value.code) == (415, "unsupported_media_type")


@pytest.mark.parametrize(
    ("path", "item_id"),
    [
        ("/api/v1/items/1/orders", 1),
        ("/api/v1/items/9223372036854775807/orders", 2**63 - 1),
        ("/api/v1/items/007/orders", 7),
        ("/api/v1/items/0/orders", None),
        ("/api/v1/items/9223372036854775808/orders", None),
        ("/api/v1/items/-1/orders", None),
        ("/api/v1/items/abc/orders", None),
        ("/api/v1/items/\u0661/orders", None),  # a digit, but not an ASCII one
    ],
)
def test_item_ids(path: str, item_id: int | None) -> None:
    if item_id is not None:
        assert _item_id(PURCHASE_PATH, path) == item_id
        return
    with pytest.raises(ApiError) as refused:
        _item_id(PURCHASE_PATH, path)
    assert (refused.value.status, refused.value.code) == (422, "invalid_request")


def test_idempotency_keys() -> None:
    assert idempotency_key(' "abc" ') == "abc"
    assert idempotency_key("abc") == "abc"
    assert idempotency_key('"') == '"'
    with pytest.raises(ApiError) as missing:
        idempotency_key(None)
    assert (missing.value.status, missing.value.code) == (400, "idempotency_key_required")


@given(
    st.integers(1, 2**63 - 1),
    st.integers(1, MAX_ID),
    st.integers(1, 1_000_000),
    st.integers(0, 253_402_300_799_999),  # to the last millisecond of year 9999
)
def test_the_held_answer_is_the_models(
    order_id: int, item_id: int, quantity: int, deadline_ms: int
) -> None:
    model = ReservationOut(
        order_id=str(order_id),
        item_id=item_id,
        quantity=quantity,
        status=OrderStatus.HELD,
        pay_before=ms_to_datetime(deadline_ms),
    )
    assert held_body(order_id, item_id, quantity, deadline_ms) == model.model_dump_json().encode()


def test_a_body_read_before_answers_as_it_did_and_a_refused_one_is_refused_again() -> None:
    first = _quantity(b'{"quantity": 3}', b"application/json")
    assert _quantity(b'{"quantity": 3}', b"application/json") is first
    for _ in range(2):
        with pytest.raises(ApiError):
            _quantity(b'{"quantity": 3}', b"text/plain")
        with pytest.raises(ApiError):
            _quantity(b'{"quantity": 0}', b"application/json")
