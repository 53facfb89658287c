"""Order events as broker messages (no broker): the id, the routing and the versioned body."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from seckill.domain.events import (
    TRANSFERS,
    BadEvent,
    EventKind,
    RefundReason,
    StockEvent,
    decode_event,
)
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.sinks.messages import (
    ROUTING_KEYS,
    SCHEMA,
    OrderEventBody,
    body_schema,
    message_id,
    order_message,
)

STREAM = item_keys(42, DEFAULT_PREFIX).events
AT_MS = 1_714_564_800_123  # 2024-05-01T12:00:00.123Z
ORDER_ID = 2**63 - 1  # the largest order id: a float would round it

# Each event's fields as the Lua scripts write them.
ENTRIES: dict[EventKind, dict[str, str]] = {
    EventKind.RESERVED: {
        "event": "reserved",
        "item_id": "42",
        "order_id": str(ORDER_ID),
        "buyer": "buyer-1",
        "quantity": "2",
        "deadline_ms": str(AT_MS + 60_000),
        "at_ms": str(AT_MS),
        "request_id": "req-1",
    },
    EventKind.PAID: {
        "event": "paid",
        "item_id": "42",
        "order_id": str(ORDER_ID),
        "buyer": "buyer-1",
        "quantity": "2",
        "payment_id": "pay-1",
        "at_ms": str(AT_MS + 1),
    },
    EventKind.RELEASED: {
        "event": "released",
        "item_id": "42",
        "order_id": str(ORDER_ID),
        "buyer": "buyer-1",
        "quantity": "2",
        "reason": "expired",
        "at_ms": str(AT_MS + 2),
    },
    EventKind.REFUND_REQUIRED: {
        "event": "refund_required",
        "item_id": "42",
        "order_id": str(ORDER_ID),
        "buyer": "buyer-1",
        "quantity": "2",
        "reason": "expired",
        "payment_id": "pay-2",
        "at_ms": str(AT_MS + 3),
    },
}


def body_of(kind: EventKind, *, stream: str = STREAM, shard: int = 0) -> dict[str, Any]:
    message = order_message(decode_event(f"{AT_MS}-7", ENTRIES[kind], shard=shard), stream=stream)
    assert message is not None
    parsed: dict[str, Any] = json.loads(message.body)
    return parsed


# The body's fields, pinned: renaming or removing one breaks every consumer of version 1.
FIELDS = [
    "schema",
    "event",
    "item_id",
    "order_id",
    "buyer",
    "quantity",
    "at",
    "at_ms",
    "deadline",
    "deadline_ms",
    "reason",
    "request_id",
    "stream",
    "entry_id",
    "shard",
    "payment_id",  # added within version 1, at the end
    "amount_cents",  # added within version 1 too
    "currency",
]


def test_the_schema_is_versioned_and_its_fields_pinned() -> None:
    schema = body_schema()
    assert SCHEMA == "seckill.order-event/1"
    assert schema["title"] == SCHEMA
    assert list(schema["properties"]) == FIELDS
    assert schema["required"] == FIELDS  # always present, null where it does not apply
    assert schema["properties"]["schema"]["const"] == SCHEMA
    assert schema["properties"]["order_id"]["type"] == "string"  # 64-bit: a decimal string
    assert set(schema["properties"]["event"]["enum"]) == {k.value for k in ROUTING_KEYS}
    reasons = schema["properties"]["reason"]["anyOf"][0]["enum"]
    # A new reason joins the schema (a refund for an unknown order is not an order's event).
    assert set(reasons) == {r.value for r in RefundReason} - {RefundReason.UNKNOWN_ORDER}
    for kind in ENTRIES:
        assert list(body_of(kind)) == FIELDS


def test_only_order_events_are_forwarded_each_under_its_routing_key() -> None:
    assert ROUTING_KEYS == {
        EventKind.RESERVED: "order.reserved",
        EventKind.PAID: "order.paid",
        EventKind.RELEASED: "order.released",
        EventKind.REFUND_REQUIRED: "order.refund_required",
    }
    # A new kind of event fails here until it is forwarded or said not to be.
    assert set(EventKind) - set(ROUTING_KEYS) == {EventKind.LOADED, *TRANSFERS}


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        (EventKind.LOADED, {"total": "10", "available": "10"}),
        (EventKind.TRANSFERRED_OUT, {"transfer_id": "t-1", "to_shard": "1", "quantity": "3"}),
        (EventKind.TRANSFERRED_IN, {"transfer_id": "t-1", "from_shard": "0", "quantity": "3"}),
    ],
)
def test_events_of_no_order_give_no_message(kind: EventKind, fields: dict[str, str]) -> None:
    event = decode_event("1-0", {"event": kind.value, "item_id": "42", "at_ms": "1", **fields})
    assert order_message(event, stream=STREAM) is None


def test_a_reserved_event_as_a_message() -> None:
    event = decode_event(f"{AT_MS}-7", ENTRIES[EventKind.RESERVED])
    message = order_message(event, stream=STREAM)

    assert message is not None
    assert message.message_id == f"seckill:{{item:42}}:events/{AT_MS}-7"
    assert message.kind is EventKind.RESERVED
    assert message.routing_key == "order.reserved"
    assert message.at_ms == AT_MS
    assert json.loads(message.body) == {
        "schema": "seckill.order-event/1",
        "event": "reserved",
        "item_id": 42,
        "order_id": "9223372036854775807",
        "buyer": "buyer-1",
        "quantity": 2,
        "at": "2024-05-01T12:00:00.123000Z",
        "at_ms": AT_MS,
        "deadline": "2024-05-01T12:01:00.123000Z",
        "deadline_ms": AT_MS + 60_000,
        "reason": None,
        "request_id": "req-1",
        "stream": "seckill:{item:42}:events",
        "entry_id": f"{AT_MS}-7",
        "shard": 0,
        "payment_id": None,
        "amount_cents": None,
        "currency": None,
    }


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (EventKind.PAID, None),
        (EventKind.RELEASED, "expired"),
        (EventKind.REFUND_REQUIRED, "expired"),
    ],
)
def test_the_other_order_events(kind: EventKind, reason: str | None) -> None:
    body = body_of(kind)
    assert body["event"] == kind.value
    assert body["reason"] == reason
    assert body["payment_id"] == ENTRIES[kind].get("payment_id")
    assert body["deadline"] is body["deadline_ms"] is body["request_id"] is None
    assert (body["order_id"], body["buyer"], body["quantity"]) == (str(ORDER_ID), "buyer-1", 2)


def test_a_shard_streams_events_say_their_shard_and_stream() -> None:
    shard_stream = item_keys(42, DEFAULT_PREFIX, shard=3).events
    body = body_of(EventKind.PAID, stream=shard_stream, shard=3)
    assert (body["stream"], body["shard"]) == ("seckill:{item:42:s3}:events", 3)


def test_the_id_names_the_entry_and_only_it() -> None:
    event = decode_event("5-1", ENTRIES[EventKind.PAID])
    again = decode_event("5-1", dict(ENTRIES[EventKind.PAID]))
    first, second = (order_message(e, stream=STREAM) for e in (event, again))
    assert first is not None and second is not None
    assert first == second  # a redelivered entry is the same message, body and all
    assert first.message_id == message_id(STREAM, "5-1") == f"{STREAM}/5-1"
    others = {
        message_id(STREAM, "5-2"),
        message_id(item_keys(43, DEFAULT_PREFIX).events, "5-1"),
        message_id(item_keys(42, DEFAULT_PREFIX, shard=1).events, "5-1"),
    }
    assert first.message_id not in others and len(others) == 3


@pytest.mark.parametrize("kind", list(ENTRIES))
def test_every_body_passes_its_json_schema_and_reads_back(kind: EventKind) -> None:
    validator = jsonschema_rs.validator_for(body_schema(), validate_formats=True)
    body = body_of(kind)
    validator.validate(body)
    assert OrderEventBody.model_validate(body).model_dump(mode="json") == body


def test_the_schema_refuses_a_body_of_another_shape() -> None:
    validator = jsonschema_rs.validator_for(body_schema(), validate_formats=True)
    body = body_of(EventKind.PAID)
    for broken in (
        {**body, "schema": "seckill.order-event/2"},
        {**body, "order_id": ORDER_ID},  # a number: JavaScript would round it
        {**body, "at": "yesterday"},
        {key: value for key, value in body.items() if key != "reason"},
    ):
        assert not validator.is_valid(broken)


def test_an_order_event_without_its_order_is_a_bad_event() -> None:
    event = StockEvent(event_id="1-0", kind=EventKind.PAID, item_id=42, at_ms=1)
    with pytest.raises(BadEvent, match="without its order"):
        order_message(event, stream=STREAM)


def test_a_refund_for_an_unknown_order_is_not_an_order_event() -> None:
    """It names no buyer and changes no order: it stays in the refunds owed, off the brokers."""
    fields = {
        "event": "refund_required", "item_id": "1", "order_id": "424242", "at_ms": "5",
        "reason": "unknown_order", "payment_id": "pay-1", "amount": "1250", "currency": "EUR",
    }  # fmt: skip
    assert order_message(decode_event("5-0", fields), stream="s") is None
    fields |= {"reason": "amount_mismatch", "buyer": "alice", "quantity": "1"}
    message = order_message(decode_event("5-1", fields), stream="s")
    assert message is not None
    body = json.loads(message.body)
    assert (body["reason"], body["amount_cents"], body["currency"]) == (
        "amount_mismatch", 1250, "EUR"
    )  # fmt: skip
