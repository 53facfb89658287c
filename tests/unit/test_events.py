"""Decoding a stream entry: every field checked, and anything malformed refused as a BadEvent
with its reason (never a bare ValueError, which the persister would not dead-letter)."""

from __future__ import annotations

import pytest

from seckill.domain.events import BadEvent, EventKind, ReleaseReason, decode_event

RESERVED = {
    "event": "reserved", "item_id": "7", "order_id": "12", "buyer": "ann", "quantity": "2",
    "deadline_ms": "1700000060000", "at_ms": "1700000000000", "request_id": "r1", "key": "k1",
}  # fmt: skip


def test_a_reserved_entry_decodes_to_its_event() -> None:
    event = decode_event("1700000000000-3", RESERVED, shard=1)
    assert (event.kind, event.item_id, event.order_id, event.buyer, event.quantity) == (
        EventKind.RESERVED, 7, 12, "ann", 2,
    )  # fmt: skip
    assert (event.shard, event.position, event.deadline_ms, event.at_ms) == (
        1, (1700000000000, 3), 1700000060000, 1700000000000,
    )  # fmt: skip
    assert (event.request_id, event.idempotency_key, event.reason) == ("r1", "k1", None)


def test_a_release_carries_its_reason() -> None:
    fields = {**RESERVED, "event": "released", "reason": "expired"}
    assert decode_event("1-0", fields).reason is ReleaseReason.EXPIRED


@pytest.mark.parametrize(
    ("entry_id", "changes", "says"),
    [
        ("12-x", {}, "not a stream id"),
        ("²-0", {}, "not a stream id"),
        ("1-0", {"event": "shipped"}, "unknown event kind 'shipped'"),
        ("1-0", {"buyer": ""}, "reserved event without buyer"),
        ("1-0", {"deadline_ms": ""}, "without deadline_ms"),
        ("1-0", {"item_id": "0"}, "'item_id' must be a whole number >= 1, got '0'"),
        ("1-0", {"quantity": "-1"}, "'quantity' must be a whole number >= 1"),
        ("1-0", {"order_id": "²"}, "'order_id' must be a whole number >= 1, got '²'"),
        ("1-0", {"at_ms": "1e3"}, "'at_ms' must be a whole number"),
        ("1-0", {"event": "released", "reason": "lost"}, "unknown released reason 'lost'"),
        ("1-0", {"event": "refund_required", "reason": "lost"}, "unknown refund_required"),
    ],
)
def test_a_malformed_entry_is_refused_with_its_reason(
    entry_id: str, changes: dict[str, str], says: str
) -> None:
    with pytest.raises(BadEvent) as refused:
        decode_event(entry_id, {**RESERVED, **changes})
    assert says in str(refused.value)
