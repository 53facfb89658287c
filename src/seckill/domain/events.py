"""Stream events: what the scripts append to an item's stream, decoded and checked, and encoded
again for an event put back on a stream (recovery).

The field names are the ones the Lua scripts write (``event``, ``item_id``, ``order_id``...).
A malformed entry raises :class:`BadEvent` with a readable reason; it never lands half-read.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ReleaseReason(StrEnum):
    """Why a hold gave its stock back: the reason a ``released`` event carries (defined here,
    below holds and orders, which both build on events)."""

    CANCELLED = "cancelled"
    EXPIRED = "expired"
    PAYMENT_FAILED = "payment_failed"


class RefundReason(StrEnum):
    """Why a successful charge is owed back: its order was released before it (the release's
    reason: the deadline is the contract, money never brings stock back), or another payment
    had already paid the order (a buyer's double click on "pay" charged twice)."""

    CANCELLED = "cancelled"
    EXPIRED = "expired"
    PAYMENT_FAILED = "payment_failed"
    DUPLICATE_CHARGE = "duplicate_charge"


class EventKind(StrEnum):
    LOADED = "loaded"
    RESERVED = "reserved"
    PAID = "paid"
    RELEASED = "released"
    REFUND_REQUIRED = "refund_required"
    # Stock moving between two shards of an item: no order, no change to the item's counters.
    TRANSFERRED_OUT = "transferred_out"
    TRANSFERRED_IN = "transferred_in"


TRANSFERS = frozenset({EventKind.TRANSFERRED_OUT, EventKind.TRANSFERRED_IN})


class BadEvent(ValueError):
    """An entry that cannot be applied as it is: it goes to dead letters, never silently away."""


class AheadOfStream(BadEvent):
    """Landing this event now would take a counter below zero: legitimate only while an earlier
    event of the same stream (the release that freed the stock) is still on its way."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StockEvent:
    event_id: str  # the stream entry id: unique within its stream
    kind: EventKind
    item_id: int
    at_ms: int
    shard: int = 0  # the stock shard whose stream carried it (not a field of the entry)
    order_id: int | None = None
    buyer: str | None = None
    quantity: int | None = None
    deadline_ms: int | None = None
    # released: why; refund_required: why the charge is owed back
    reason: ReleaseReason | RefundReason | None = None
    payment_id: str | None = None  # paid, refund_required: the payment it concerns
    total: int | None = None  # loaded only
    request_id: str | None = None  # reserved only: the API request that made the hold
    idempotency_key: str | None = None  # reserved only: the buyer's key for the purchase
    transfer_id: str | None = None  # transfers only, with quantity: the units moved

    @property
    def position(self) -> tuple[int, int]:
        """The entry id as numbers, for ordering (``"12-3"`` -> ``(12, 3)``)."""
        return stream_position(self.event_id)


def stream_position(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


_REQUIRED = {
    EventKind.LOADED: ("total",),
    EventKind.RESERVED: ("order_id", "buyer", "quantity", "deadline_ms"),
    EventKind.PAID: ("order_id", "buyer", "quantity"),
    EventKind.RELEASED: ("order_id", "buyer", "quantity", "reason"),
    EventKind.REFUND_REQUIRED: ("order_id", "buyer", "quantity", "reason"),
    EventKind.TRANSFERRED_OUT: ("transfer_id", "quantity"),
    EventKind.TRANSFERRED_IN: ("transfer_id", "quantity"),
}


def _number(fields: dict[str, str], name: str, *, low: int = 0) -> int:
    raw = fields[name]
    if not raw.isdigit() or int(raw) < low:
        raise BadEvent(f"field {name!r} must be a whole number >= {low}, got {raw!r}")
    return int(raw)


def decode_event(entry_id: str, fields: dict[str, str], *, shard: int = 0) -> StockEvent:
    try:
        stream_position(entry_id)
    except ValueError:
        raise BadEvent(f"entry id {entry_id!r} is not a stream id") from None
    try:
        kind = EventKind(fields.get("event", ""))
    except ValueError:
        raise BadEvent(f"unknown event kind {fields.get('event')!r}") from None
    missing = [f for f in ("item_id", "at_ms", *_REQUIRED[kind]) if not fields.get(f)]
    if missing:
        raise BadEvent(f"{kind} event without {', '.join(missing)}")
    get = fields.get
    reason = get("reason")
    reasons = RefundReason if kind is EventKind.REFUND_REQUIRED else ReleaseReason
    try:
        why = reasons(reason) if reason else None
    except ValueError:
        raise BadEvent(f"unknown {kind} reason {reason!r}") from None
    return StockEvent(
        event_id=entry_id,
        shard=shard,
        kind=kind,
        item_id=_number(fields, "item_id", low=1),
        at_ms=_number(fields, "at_ms"),
        order_id=_number(fields, "order_id", low=1) if get("order_id") else None,
        buyer=get("buyer"),
        quantity=_number(fields, "quantity", low=1) if get("quantity") else None,
        deadline_ms=_number(fields, "deadline_ms") if get("deadline_ms") else None,
        reason=why,
        payment_id=get("payment_id") or None,
        total=_number(fields, "total") if get("total") else None,
        request_id=get("request_id") or None,
        idempotency_key=get("key") or None,
        transfer_id=get("transfer_id") or None,
    )


ORDER_EVENTS = frozenset(
    {EventKind.RESERVED, EventKind.PAID, EventKind.RELEASED, EventKind.REFUND_REQUIRED}
)


def encode_order_event(event: StockEvent) -> dict[str, str]:
    """The fields of the stream entry an order event was, as the scripts write them: the inverse
    of :func:`decode_event` for the events recovery puts back (the entry id and shard are the
    entry's place, not its fields). Item and transfer events carry fields a StockEvent does not
    keep, so they are refused."""
    if event.kind not in ORDER_EVENTS:
        raise ValueError(f"a {event.kind} event is not an order event")
    fields = {"event": str(event.kind), "item_id": str(event.item_id), "at_ms": str(event.at_ms)}
    present = {
        "order_id": event.order_id,
        "buyer": event.buyer,
        "quantity": event.quantity,
        "deadline_ms": event.deadline_ms,
        "reason": event.reason,
        "payment_id": event.payment_id,
    }
    fields |= {name: str(value) for name, value in present.items() if value is not None}
    if event.kind is EventKind.RESERVED:  # reserve.lua writes both, "" for none
        fields |= {"request_id": event.request_id or "", "key": event.idempotency_key or ""}
    return fields
