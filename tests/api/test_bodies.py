"""Bodies are read strictly on every route that takes one: a key given twice is a 422 naming it,
and integers are JSON integers. A lenient reader would take the last of two keys and read "1",
true or 1.0 as 1: a client or provider whose parser reads otherwise would disagree with us about
what it sent. Each refusal changes nothing."""

from __future__ import annotations

import pytest

from seckill.security.tickets import TICKET_HEADER
from tests.api.conftest import Api

# The rule is the API's, the same whatever stores sit behind it.
pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]


async def buy_with(api: Api, item_id: int, body: bytes, key: str) -> tuple[int, dict[str, str]]:
    ticket = await api.ticket(item_id, "alice")
    answer = await api.http.post(
        f"/api/v1/items/{item_id}/orders",
        headers={
            **api.as_buyer("alice"),
            "Idempotency-Key": key,
            TICKET_HEADER: ticket,
            "Content-Type": "application/json",
        },
        content=body,
    )
    return answer.status_code, answer.json()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"quantity": 1, "quantity": 3}', "body.quantity: given twice"),
        (b'{"quantity": "1"}', "body.quantity"),
        (b'{"quantity": true}', "body.quantity"),
        (b'{"quantity": 1.0}', "body.quantity"),
        (b'{"quantity": NaN}', "body.quantity"),
        (b'{"quantity": null}', "body.quantity"),
        (b"[1]", "body"),
    ],
)
async def test_a_purchase_body_is_read_strictly(api: Api, body: bytes, named: str) -> None:
    item_id = await api.create_item(total=5, limit=3)
    status, answer = await buy_with(api, item_id, body, "strict")
    assert (status, answer["error"]) == (422, "invalid_request"), answer
    assert answer["message"].startswith(named), answer
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == 0  # nothing was held
    # The same key with a readable body is decided afresh: the refusal recorded nothing.
    status, held = await buy_with(api, item_id, b'{"quantity": 3}', "strict")
    assert status == 202, held


async def test_a_payment_notice_with_a_key_given_twice_is_refused(api: Api) -> None:
    item_id = await api.create_item(total=5)
    order_id = (await api.buy(item_id, "alice", "k")).json()["order_id"]
    # {"status": "failed", "status": "succeeded"}: a first-key reader sees a failure.
    text = (
        f'{{"payment_id": "pay-1", "item_id": {item_id}, "order_id": "{order_id}", '
        '"status": "failed", "status": "succeeded"}'
    )
    body = text.encode()
    refused = await api.http.post(
        "/api/v1/payments/callback", content=body, headers=api.signed_headers(body)
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"] == "body.status: given twice"
    hold = await api.runtime.engine.hold(item_id, int(order_id))
    assert hold is not None and hold.state == "held"
    # The payment id was not recorded: a clean notice with it is applied.
    paid = await api.pay(item_id, order_id, "pay-1")
    assert paid.json()["outcome"] == "paid", paid.text


@pytest.mark.parametrize("item_id", ['"1"', "1.0", "true"])
async def test_a_payment_notice_names_its_item_by_an_integer(api: Api, item_id: str) -> None:
    real = await api.create_item(total=5)
    order_id = (await api.buy(real, "alice", "k")).json()["order_id"]
    text = (
        f'{{"payment_id": "pay-1", "item_id": {item_id}, "order_id": "{order_id}", '
        '"status": "succeeded"}'
    ).encode()
    refused = await api.http.post(
        "/api/v1/payments/callback", content=text, headers=api.signed_headers(text)
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"].startswith("body.item_id"), refused.text


@pytest.mark.parametrize(
    ("field", "value"),
    [("total", '"5"'), ("total", "5.0"), ("price_cents", "true"), ("total", '5, "total": 6')],
)
async def test_a_new_item_is_read_strictly(api: Api, field: str, value: str) -> None:
    fields = {
        "name": '"n"',
        "price_cents": "100",
        "total": "5",
        "starts_at": '"2030-01-01T00:00:00Z"',
        "ends_at": '"2030-01-01T01:00:00Z"',
        field: value,
    }
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    refused = await api.http.post(
        "/api/v1/admin/items",
        headers={**api.as_admin, "Content-Type": "application/json"},
        content=text.encode(),
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"].startswith(f"body.{field}"), refused.text
    listed = await api.http.get("/api/v1/admin/items", headers=api.as_admin)
    assert listed.json() == {"items": [], "next_cursor": None}  # nothing was created


async def test_a_bad_body_from_a_stranger_is_a_401_not_a_422(api: Api) -> None:
    answer = await api.http.post("/api/v1/admin/items", content=b'{"total": "x"}')
    assert answer.status_code == 401, answer.text


async def test_the_schema_says_so(api: Api) -> None:
    schema = (await api.http.get("/openapi.json")).json()
    bodies = {
        (path, method): operation["requestBody"]["content"]["application/json"]["schema"]
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
        if "requestBody" in operation
    }
    # The purchase, the payment notice, a new item, dead letters to replay and to drop.
    assert len(bodies) == 5
    for where, declared in bodies.items():
        body = next(b for b in declared.get("anyOf", [declared]) if b.get("type") != "null")
        if "$ref" in body:
            body = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
        assert "given twice" in body["description"], where
    quantity = schema["components"]["schemas"]["BuyIn"]["properties"]["quantity"]
    assert quantity["type"] == "integer"
