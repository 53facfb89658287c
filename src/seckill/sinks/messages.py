"""What a sink sends: one message per order event, the same body on every broker.

The body is ``seckill.order-event/1``, a JSON object described by :class:`OrderEventBody`
(:func:`body_schema` prints its JSON Schema). Every field is always present, ``null`` where it
does not apply to the event. Within version 1 a field keeps its name, type and meaning; a field
may be added, so a consumer ignores the ones it does not know. Anything else is version 2.

Only the four order events are forwarded (:data:`ROUTING_KEYS`): they are what the shop's other
systems follow. A refund owed for an order nobody knows (``unknown_order``: a charge the
provider sent for an order id this deployment never issued or lost) changes no order, and has
no buyer to name: it is in the refunds owed (SQL, the admin API), not on the brokers. ``loaded``
is an operator setting an item's stock, already in SQL and the admin API; the transfers move
stock between an item's shards, bookkeeping that changes no order and no total.
:func:`order_message` answers ``None`` for those, and the caller acknowledges them without
publishing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from seckill.domain.events import BadEvent, EventKind, RefundReason, StockEvent
from seckill.domain.times import ms_to_datetime

SCHEMA: Final = "seckill.order-event/1"
CONTENT_TYPE: Final = "application/json"

# The enums' values inline, as Literals: the enums themselves would become schema components.
OrderEventKind = Literal[
    EventKind.RESERVED, EventKind.PAID, EventKind.RELEASED, EventKind.REFUND_REQUIRED
]
ReasonLiteral = Literal[
    RefundReason.CANCELLED,
    RefundReason.EXPIRED,
    RefundReason.PAYMENT_FAILED,
    RefundReason.DUPLICATE_CHARGE,
    RefundReason.AMOUNT_MISMATCH,
    RefundReason.CURRENCY_MISMATCH,
]
# Order ids are 64-bit: JSON carries them as decimal strings, which JavaScript cannot round (as
# the HTTP API does).
OrderIdText = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,18}$")]

ROUTING_KEYS: Final[dict[EventKind, str]] = {
    kind: f"order.{kind.value}" for kind in get_args(OrderEventKind)
}
"""The events forwarded, and the routing key (RabbitMQ) or subject suffix (NATS) of each."""


class OrderEventBody(BaseModel):
    """seckill.order-event/1: one state change of one order, as its item's stream has it.

    The pair (stream, entry_id) names the entry, and the message id is built from it
    ("<stream>/<entry_id>"): a redelivery carries the same id. After a Redis recovery replays
    an order's events, the same change can come again under a new entry: a consumer that must
    act once keys its effect on (order_id, event) as well. Every field is always present, null
    where it does not apply; a consumer ignores fields it does not know.
    """

    model_config = ConfigDict(
        frozen=True, validate_by_name=True, serialize_by_alias=True, title=SCHEMA
    )

    schema_id: Literal["seckill.order-event/1"] = Field(
        alias="schema", description="The body's name and version."
    )
    event: OrderEventKind = Field(
        description="reserved (units held for the buyer until the deadline), paid, released "
        "(the held units went back on sale), refund_required (a payment that paid nothing: the "
        "hold was released before it, or another payment had paid the order; its money goes "
        "back)."
    )
    item_id: int = Field(ge=1)
    order_id: OrderIdText
    buyer: str
    quantity: int = Field(ge=1, description="Units of the order.")
    at: AwareDatetime = Field(description="When the change happened (Redis's clock), UTC.")
    at_ms: int = Field(ge=0, description="at, in milliseconds since the Unix epoch.")
    deadline: AwareDatetime | None = Field(
        description="reserved only: the buyer pays before this, or the hold is released."
    )
    deadline_ms: int | None = Field(ge=0, description="deadline, in ms since the Unix epoch.")
    reason: ReasonLiteral | None = Field(
        description="released: why the hold was released; refund_required: why the money goes "
        "back (the release's reason; duplicate_charge: another payment paid the order; "
        "amount_mismatch, currency_mismatch: the charge was not the order's sum, and the order "
        "is as it was)."
    )
    request_id: str | None = Field(
        description="reserved only: the HTTP request that made the hold (its X-Request-Id)."
    )
    stream: str = Field(description="The Redis stream the event was read from.")
    entry_id: str = Field(description="The event's entry id in that stream.")
    shard: int = Field(ge=0, description="The item's stock shard that stream belongs to.")
    # Added within version 1 (a consumer ignores fields it does not know).
    payment_id: str | None = Field(
        description="paid and refund_required only: the payment (the provider's id, unique "
        "within the item). A refund is owed once per payment_id."
    )
    amount_cents: int | None = Field(
        description="refund_required only: the sum charged, owed back, in minor units of "
        "currency (null for an event journaled before charges carried their sum)."
    )
    currency: str | None = Field(description="refund_required only: the charge's ISO 4217 code.")


def forwarded(kind: str, reason: str | None) -> bool:
    """Whether an event of this kind and reason is published (see the module's docstring): the
    one rule, for the bridge and for whoever checks what it published."""
    return kind in ROUTING_KEYS and reason != RefundReason.UNKNOWN_ORDER


def body_schema() -> dict[str, Any]:
    """The JSON Schema of the message body, for the shop's consumers."""
    return OrderEventBody.model_json_schema(mode="serialization")


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One order event, ready for any broker."""

    message_id: str  # stable: the same stream entry always gives the same id
    kind: EventKind
    routing_key: str  # "order.paid": RabbitMQ's routing key, the end of NATS's subject
    body: bytes  # JSON, ``seckill.order-event/1``
    at_ms: int  # when the event happened: the broker message's timestamp


def message_id(stream: str, entry_id: str) -> str:
    """The id of the message carrying a stream entry: ``"<stream key>/<entry id>"``."""
    return f"{stream}/{entry_id}"


def order_message(event: StockEvent, *, stream: str) -> Message | None:
    """The message for an event read from ``stream`` (the item stream's key), or ``None`` for
    an event that is not forwarded (see the module's docstring).

    Raises :class:`BadEvent` for an order event without its order (never one decoded by
    ``decode_event``, which checks every field the kind needs)."""
    if not forwarded(event.kind, event.reason):
        return None
    routing_key = ROUTING_KEYS[event.kind]
    if event.order_id is None or event.buyer is None or event.quantity is None:
        raise BadEvent(f"{event.kind} event {event.event_id} without its order")
    body = OrderEventBody(
        schema_id=SCHEMA,
        event=event.kind,
        item_id=event.item_id,
        order_id=str(event.order_id),
        buyer=event.buyer,
        quantity=event.quantity,
        at=ms_to_datetime(event.at_ms),
        at_ms=event.at_ms,
        deadline=None if event.deadline_ms is None else ms_to_datetime(event.deadline_ms),
        deadline_ms=event.deadline_ms,
        reason=event.reason,
        request_id=event.request_id,
        stream=stream,
        entry_id=event.event_id,
        shard=event.shard,
        payment_id=event.payment_id,
        amount_cents=event.amount_cents,
        currency=event.currency,
    )
    return Message(
        message_id=message_id(stream, event.event_id),
        kind=event.kind,
        routing_key=routing_key,
        body=body.model_dump_json().encode(),
        at_ms=event.at_ms,
    )
