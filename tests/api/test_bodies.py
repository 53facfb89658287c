"""Bodies are read strictly on every route that takes one: a key given twice is a 422 naming it,
and integers are JSON integers. A lenient reader would take the last of two keys and read "1",
true or 1.0 as 1: a client or provider whose parser reads otherwise would disagree with us about
what it sent. The same for the bytes (UTF-8 only, sent as application/json) and for a query
parameter given twice. Each refusal changes nothing."""

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
    # The purchase, the payment notice, a new item, dead letters to replay and to drop, a
    # refund marked refunded.
    assert len(bodies) == 6
    for where, declared in bodies.items():
        body = next(b for b in declared.get("anyOf", [declared]) if b.get("type") != "null")
        if "$ref" in body:
            body = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
        assert "given twice" in body["description"], where
    quantity = schema["components"]["schemas"]["BuyIn"]["properties"]["quantity"]
    assert quantity["type"] == "integer"


# Bodies are UTF-8, sent as application/json: json.loads(bytes) would guess UTF-16 or UTF-32,
# and a proxy or firewall reading UTF-8 would see another request than the one acted on.
QUANTITY_3 = '{"quantity": 3}'
FOREIGN = {
    "utf-16 with a BOM": ("utf-16", "UTF-16"),
    "utf-16 without": ("utf-16-le", "UTF-16"),
    "utf-32 with a BOM": ("utf-32", "UTF-32"),
    "utf-32 without": ("utf-32-be", "UTF-32"),
}


def new_item_body() -> str:
    return (
        '{"name": "n", "price_cents": 100, "total": 5, '
        '"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-01T01:00:00Z"}'
    )


def notice_body(item_id: int, order_id: str) -> str:
    return (
        f'{{"payment_id": "pay-1", "item_id": {item_id}, "order_id": "{order_id}", '
        '"status": "succeeded"}'
    )


@pytest.mark.parametrize(("codec", "named"), FOREIGN.values(), ids=FOREIGN.keys())
async def test_a_purchase_in_another_encoding_is_refused(api: Api, codec: str, named: str) -> None:
    item_id = await api.create_item(total=5, limit=3)
    status, answer = await buy_with(api, item_id, QUANTITY_3.encode(codec), "foreign")
    assert (status, answer) == (
        422,
        {"error": "invalid_request", "message": f"body: not UTF-8 ({named} is refused)"},
    )
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == 0


async def test_a_purchase_in_utf8_with_a_bom_is_refused(api: Api) -> None:
    item_id = await api.create_item(total=5, limit=3)
    status, answer = await buy_with(api, item_id, QUANTITY_3.encode("utf-8-sig"), "bom")
    assert (status, answer["message"]) == (422, "body: UTF-8 with a byte order mark")
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == 0


@pytest.mark.parametrize(("codec", "named"), FOREIGN.values(), ids=FOREIGN.keys())
async def test_a_new_item_in_another_encoding_is_refused(api: Api, codec: str, named: str) -> None:
    refused = await api.http.post(
        "/api/v1/admin/items",
        headers={**api.as_admin, "Content-Type": "application/json"},
        content=new_item_body().encode(codec),
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"] == f"body: not UTF-8 ({named} is refused)"
    listed = await api.http.get("/api/v1/admin/items", headers=api.as_admin)
    assert listed.json()["items"] == []


@pytest.mark.parametrize(("codec", "named"), FOREIGN.values(), ids=FOREIGN.keys())
async def test_a_payment_notice_in_another_encoding_is_refused(
    api: Api, codec: str, named: str
) -> None:
    item_id = await api.create_item(total=5)
    order_id = (await api.buy(item_id, "alice", "k")).json()["order_id"]
    body = notice_body(item_id, order_id).encode(codec)  # signed as sent: only the text is bad
    refused = await api.http.post(
        "/api/v1/payments/callback", content=body, headers=api.signed_headers(body)
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"] == f"body: not UTF-8 ({named} is refused)"
    hold = await api.runtime.engine.hold(item_id, int(order_id))
    assert hold is not None and hold.state == "held"
    paid = await api.pay(item_id, order_id, "pay-1")  # the payment id was not recorded
    assert paid.json()["outcome"] == "paid", paid.text


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/json; charset=utf-16", "application/xml"]
)
async def test_a_body_not_sent_as_json_is_a_415_on_every_route(
    api: Api, content_type: str | None
) -> None:
    item_id = await api.create_item(total=5)
    order_id = (await api.buy(item_id, "alice", "k")).json()["order_id"]
    sent = {} if content_type is None else {"Content-Type": content_type}
    notice = notice_body(item_id, order_id).encode()
    signed = {**api.signed_headers(notice), **sent}
    if content_type is None:
        del signed["Content-Type"]
    ticket = await api.ticket(item_id, "bob")
    calls = [
        (
            f"/api/v1/items/{item_id}/orders",
            {**api.as_buyer("bob"), "Idempotency-Key": "k", TICKET_HEADER: ticket, **sent},
            QUANTITY_3.encode(),
        ),
        ("/api/v1/admin/items", {**api.as_admin, **sent}, new_item_body().encode()),
        ("/api/v1/payments/callback", signed, notice),
        ("/api/v1/admin/dead-letters/replay", {**api.as_admin, **sent}, b'{"ids": ["1-1"]}'),
        ("/api/v1/admin/dead-letters/drop", {**api.as_admin, **sent}, b'{"ids": ["1-1"]}'),
    ]
    for path, headers, body in calls:
        # aiohttp names bytes application/octet-stream unless told otherwise: skip that default.
        answer = await api.http.post(path, headers={"Content-Type": "", **headers}, content=body)
        assert answer.status_code == 415, (path, answer.text)
        assert answer.json()["error"] == "unsupported_media_type", (path, answer.text)
    # Nothing was bought, created or paid.
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == 1
    hold = await api.runtime.engine.hold(item_id, int(order_id))
    assert hold is not None and hold.state == "held"
    listed = await api.http.get("/api/v1/admin/items", headers=api.as_admin)
    assert len(listed.json()["items"]) == 1


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/admin/items?limit=1&limit=2",
        "/api/v1/admin/refunds?limit=1&state=owed&limit=2",
        "/api/v1/admin/dead-letters?limit=&limit=",
    ],
)
async def test_a_query_parameter_given_twice_is_refused(api: Api, path: str) -> None:
    answer = await api.http.get(path, headers=api.as_admin)
    assert (answer.status_code, answer.json()) == (
        422,
        {"error": "invalid_request", "message": "query.limit: given twice"},
    )


async def test_a_query_parameter_given_twice_is_refused_on_the_lean_routes(api: Api) -> None:
    item_id = await api.create_item(total=5)
    ticket = await api.ticket(item_id, "alice")
    bought = await api.http.post(
        f"/api/v1/items/{item_id}/orders?quantity=1&quantity=2",
        headers={**api.as_buyer("alice"), "Idempotency-Key": "k", TICKET_HEADER: ticket},
    )
    assert (bought.status_code, bought.json()["message"]) == (422, "query.quantity: given twice")
    read = await api.http.get(f"/api/v1/items/{item_id}?a=1&a=1")
    assert (read.status_code, read.json()["message"]) == (422, "query.a: given twice")
    stock = await api.runtime.engine.stock(item_id)
    assert stock is not None and stock.held == 0
    # Each once is no refusal.
    assert (await api.http.get(f"/api/v1/items/{item_id}?a=1&b=1")).status_code == 200
