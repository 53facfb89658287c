"""Request and response bodies. Field names are the product's words: the same as the engine's
outcomes, the tables' columns and the README.

Order ids are 64-bit: JSON carries them as decimal strings, which JavaScript cannot round.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, cast

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from seckill.domain.events import RefundReason
from seckill.domain.items import MAX_ADMIT_PER_SECOND, MAX_PRICE, MAX_QUEUE_OPEN_SECONDS, Stock
from seckill.domain.lifecycle import Stage, Unsettled
from seckill.domain.money import RefundState
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import InvalidRequest
from seckill.domain.rules import (
    CONTROL_CHARACTERS,
    CURRENCY_PATTERN,
    MAX_AMOUNT,
    MAX_ID,
    MAX_QUANTITY,
    MAX_STOCK_SHARDS,
    MIN_QUANTITY,
    check_quantity,
    has_control_character,
)

OrderId = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,18}$")]
Token = Annotated[str, StringConstraints(pattern=r"^[!-~]{1,64}$")]  # visible ASCII
# The enum's values inline, as a Literal: the enum itself would become a schema component.
OrderStatusLiteral = Literal[
    OrderStatus.HELD, OrderStatus.PAID, OrderStatus.RELEASED, OrderStatus.REFUND_REQUIRED
]
RefundReasonLiteral = Literal[
    RefundReason.CANCELLED,
    RefundReason.EXPIRED,
    RefundReason.PAYMENT_FAILED,
    RefundReason.DUPLICATE_CHARGE,
    RefundReason.AMOUNT_MISMATCH,
    RefundReason.CURRENCY_MISMATCH,
    RefundReason.UNKNOWN_ORDER,
]
Currency = Annotated[
    str,
    StringConstraints(pattern=CURRENCY_PATTERN),
    Field(description="An ISO 4217 code: three capital letters (EUR, USD, JPY)."),
]


def _text_only(value: object) -> object:
    # Left lax, pydantic reads a number as Unix seconds or milliseconds, guessing by its size.
    # The schema promises an RFC 3339 string; take nothing else.
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string")
    return value


DateTimeText = Annotated[AwareDatetime, BeforeValidator(_text_only)]


def _plain(value: str) -> str:
    if has_control_character(value):
        raise ValueError("control characters are refused")
    return value


# Free text a person or a system names something by: no control character (the rule is
# ``seckill.domain.rules.has_control_character``; the schema says it as a pattern).
PlainText = Annotated[
    str,
    AfterValidator(_plain),
    Field(json_schema_extra={"pattern": "^" + CONTROL_CHARACTERS.replace("[", "[^", 1) + "*$"}),
]


class _In(BaseModel):
    """A request body: read by ``seckill.api.bodies.parse_body`` (each key once), unknown keys
    refused, integers as JSON integers (``StrictInt``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "description": "A JSON object. A key given twice is refused (422), as is a key not "
            "listed; integers are JSON integers, not strings, booleans or 1.0."
        },
    )


class NewItemIn(_In):
    name: PlainText = Field(min_length=1, max_length=200)
    price_cents: StrictInt = Field(
        ge=0, le=MAX_PRICE, description="The price of one unit, in minor units of its currency."
    )
    currency: Currency | None = Field(
        None, description="The price's currency (default: the server's SECKILL_CURRENCY)."
    )
    total: StrictInt = Field(ge=0, le=10**12)
    starts_at: DateTimeText
    ends_at: DateTimeText
    per_buyer_limit: StrictInt | None = Field(None, ge=1, le=MAX_QUANTITY)
    hold_seconds: StrictInt | None = Field(None, ge=1, le=2_592_000)
    stock_shards: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STOCK_SHARDS,
        description="Redis slots the stock is split over, so several primaries sell one item "
        "(default: the server's SECKILL_STOCK_SHARDS, 1). Fixed once the item is warmed.",
    )
    waiting_room: StrictBool | None = Field(
        None,
        description="Buyers queue first and get a ticket when their turn comes (default: the "
        "server's SECKILL_WAITING_ROOM). Items without one sell directly.",
    )
    queue_admit_per_second: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_ADMIT_PER_SECOND,
        description="The waiting room's pace: positions let in per second, 0 for no rate cap "
        "(default: the server's SECKILL_QUEUE_ADMIT_PER_SECOND).",
    )
    queue_open_seconds: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_QUEUE_OPEN_SECONDS,
        description="How long before the sale the waiting room opens (default: the server's "
        "SECKILL_QUEUE_OPEN_SECONDS).",
    )


class ItemOut(BaseModel):
    item_id: int
    name: str
    price_cents: int
    currency: str
    total: int
    starts_at: datetime
    ends_at: datetime
    per_buyer_limit: int
    hold_seconds: int
    stock_shards: int
    waiting_room: bool
    queue_admit_per_second: int | None = Field(
        description="The waiting room's own pace; null: the server's."
    )
    queue_open_seconds: int | None = Field(
        description="How long before the sale its waiting room opens; null: the server's."
    )
    available: int | None = Field(
        description="Units left now; null until the item is warmed. Once archived: what SQL "
        "says was left."
    )


class WarmOut(BaseModel):
    item_id: int
    outcome: Literal["loaded", "reloaded"]


class Counters(BaseModel):
    total: int
    available: int
    held: int
    sold: int


def counters_out(stock: Stock | None) -> Counters | None:
    if stock is None:
        return None
    return Counters(total=stock.total, available=stock.available, held=stock.held, sold=stock.sold)


class ItemCountersOut(BaseModel):
    item_id: int
    redis: Counters | None
    sql: Counters | None
    backlog: int = Field(description="Stream entries not yet landed in SQL.")
    agree: bool = Field(description="Redis and SQL counters are equal (expected once drained).")
    shards: list[Counters | None] = Field(
        description="Each stock shard's own counters in Redis (its total moves with transfers); "
        "one entry for an item without shards."
    )


class HindranceOut(BaseModel):
    reason: Unsettled
    detail: str


class ItemStageOut(BaseModel):
    item_id: int
    name: str
    starts_at: datetime
    ends_at: datetime
    waiting_room: bool = Field(description="Its buyers queue first (see GET /api/v1/items/{id}).")
    stage: Stage = Field(description="scheduled, on_sale, ended, settled or archived.")
    archived_at: datetime | None
    unsettled: list[HindranceOut] = Field(
        description="What keeps the item from being archived now (empty: nothing)."
    )


class ArchiveOut(BaseModel):
    item_id: int
    stage: Stage
    removed: bool = Field(description="Redis holds none of the item's keys any more.")
    unsettled: list[HindranceOut] = Field(
        description="Archived in SQL but still in Redis: what its removal waits for."
    )


class CheckOut(BaseModel):
    name: str
    ok: bool
    detail: str


class AuditOut(BaseModel):
    item_id: int
    passed: bool
    checks: list[CheckOut] = Field(
        description="The item's invariants in Redis, then Redis against SQL (exact once the "
        "stream has landed: backlog 0)."
    )


def _checked_quantity(value: object) -> int:
    try:
        check_quantity(value)
    except InvalidRequest as refused:
        raise PydanticCustomError(refused.code.value, refused.message) from None
    return cast(int, value)


# Read by the domain's rule, which the engine holds every purchase to as well: the bounds are
# stated once, and the schema says them from there.
Quantity = Annotated[
    int,
    PlainValidator(_checked_quantity),
    WithJsonSchema({"type": "integer", "maximum": MAX_QUANTITY, "minimum": MIN_QUANTITY}),
]


class BuyIn(_In):
    quantity: Quantity = 1


class ReservationOut(BaseModel):
    order_id: OrderId
    item_id: int
    quantity: int
    status: Literal[OrderStatus.HELD]
    pay_before: datetime


class OrderOut(BaseModel):
    order_id: OrderId
    item_id: int
    quantity: int
    status: OrderStatusLiteral
    release_reason: Literal["cancelled", "expired", "payment_failed"] | None
    pay_before: datetime | None


class PaymentNoticeIn(_In):
    payment_id: Token = Field(description="The provider's id for this notice; applied once.")
    item_id: StrictInt = Field(
        ge=1, le=MAX_ID, description="The order's item, as the shop gave it with the payment."
    )
    order_id: OrderId
    status: Literal["succeeded", "failed"]
    amount: StrictInt = Field(
        ge=0,
        le=MAX_AMOUNT,
        description="What the provider charged (or tried to), in minor units of `currency`. "
        "A success pays the order only if it is the order's sum (price_cents x quantity) in "
        "the item's currency.",
    )
    currency: Currency


class PaymentOut(BaseModel):
    payment_id: str
    item_id: int
    order_id: OrderId
    outcome: Literal["paid", "already_paid", "refund_required", "released", "already_released"]
    order_status: OrderStatusLiteral | None = Field(
        description="The order's status now; null for an order this server does not know."
    )
    refund_required: bool = Field(
        description="This payment paid nothing: a refund of the sum charged is owed for it "
        "(see refund_reason)."
    )
    refund_reason: RefundReasonLiteral | None = Field(
        description="Why a refund is owed: the order was released first (cancelled, expired, "
        "payment_failed), another payment had paid it (duplicate_charge), the charge was not "
        "the order's sum (amount_mismatch, currency_mismatch: the order is left as it was), or "
        "no order of that id is known under the item (unknown_order). null otherwise."
    )
    replayed: bool


class RefundOut(BaseModel):
    item_id: int
    payment_id: str
    order_id: OrderId = Field(description="As the payment notice named it.")
    buyer: str | None = Field(description="null for an order nobody knows (unknown_order).")
    quantity: int | None = Field(description="null for an order nobody knows (unknown_order).")
    amount_cents: int = Field(description="The sum charged, to give back, in minor units.")
    currency: str
    reason: RefundReasonLiteral
    state: Literal[RefundState.OWED, RefundState.REFUNDED]
    owed_at: datetime
    refunded_at: datetime | None


NextCursor = Annotated[
    str | None,
    Field(
        description="The cursor of the next (older) page: pass it as ?cursor=; null when none "
        "is left."
    ),
]


class RefundPageOut(BaseModel):
    refunds: list[RefundOut] = Field(description="Newest first.")
    next_cursor: NextCursor


class ItemStagePageOut(BaseModel):
    items: list[ItemStageOut] = Field(description="Newest first.")
    next_cursor: NextCursor


class DeadLetterOut(BaseModel):
    id: str = Field(description="What `replay` and `drop` take.")
    group: str = Field(description="The consumer group that gave up on it.")
    stream: str = Field(description="The item stream the entry was on.")
    entry_id: str
    payload: dict[str, str]
    error: str
    deliveries: int
    died_at: datetime
    replayed_at: datetime | None
    dropped_at: datetime | None


class DeadLetterPageOut(BaseModel):
    dead_letters: list[DeadLetterOut] = Field(description="Newest first.")
    next_cursor: NextCursor


class HealthOut(BaseModel):
    redis: Literal["ok", "unavailable"]
    database: Literal["ok", "unavailable"]


class LiveOut(BaseModel):
    status: Literal["alive"]


class ReadyOut(BaseModel):
    ready: bool = Field(description="Redis answers, the worker id is usable, not draining.")
    redis: Literal["ok", "unavailable"]
    worker_id_lease: Literal["held", "lapsed", "fixed"] = Field(
        description="held: leased and renewed in time; lapsed: this process issues no order id "
        "until it renews; fixed: set by SECKILL_WORKER_ID, never leased."
    )
    draining: bool = Field(description="SIGTERM arrived: the process stops after the drain.")
    database: Literal["ok", "unavailable"] = Field(
        description="Reported only: buying goes on while SQL is away (orders wait in Redis)."
    )


class AdmissionOut(BaseModel):
    at: datetime = Field(description="When the inlet took this step (Redis's clock).")
    upto: int = Field(description="Every position up to this one was let in by then.")


class QueueReportOut(BaseModel):
    item_id: int
    length: int = Field(description="Positions given (pre-start joiners count once drawn).")
    drawn: bool = Field(
        description="Whether the pre-start joiners' order was drawn (at the start)."
    )
    admitted_up_to: int
    admissions_per_s: float | None = Field(description="The inlet's pace over its last 10 s.")
    admissions: list[AdmissionOut] = Field(description="Every step of the inlet, oldest first.")


class RefundedIn(_In):
    """Which refund was given back. The payment id travels in the body, where every id arrives
    as it is: in a path, a browser collapses the segments ``.`` and ``..`` before sending."""

    item_id: StrictInt = Field(ge=1, le=MAX_ID, description="The payment's item.")
    payment_id: Token = Field(description="The provider's id of the payment refunded.")


class DeadLettersIn(_In):
    ids: list[Annotated[PlainText, StringConstraints(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=500, description="Dead letter ids, as the list gives them."
    )
    group: PlainText | None = Field(
        None, max_length=200, description="Only if they are this consumer group's."
    )


class LetterSettledOut(BaseModel):
    id: str
    refused: str | None = Field(description="Why it is still pending; null: settled.")


class SettledOut(BaseModel):
    ok: bool = Field(description="Every letter asked for was pending and is settled now.")
    missing: list[str] = Field(description="Ids that name no pending dead letter.")
    letters: list[LetterSettledOut] = Field(description="Each letter tried, in order.")


class FindingOut(BaseModel):
    kind: str = Field(description="The kind of drift, as the reconciler's journal names it.")
    subject: str = Field(description='What disagrees: "order 123", a counter, the item.')
    redis: str = Field(description="What Redis says.")
    sql: str = Field(description="What SQL says.")
    detail: str
    shard: int = Field(description="The stock shard it was found on (0 when unsharded).")


class RepairOut(BaseModel):
    kind: str
    subject: str
    action: str = Field(description="What was done, and which side won.")
    detail: str


class DriftOut(BaseModel):
    item_id: int
    position: str = Field(description='The stream position compared as of ("archived": SQL).')
    agree: bool = Field(description="Nothing disagrees (after the repairs, for a repair).")
    redis: Counters | None
    sql: Counters | None
    found: list[FindingOut]
    repairs: list[RepairOut] = Field(description="What a repair did (journaled); [] for a look.")
    left: list[FindingOut] = Field(description="What still disagrees.")
