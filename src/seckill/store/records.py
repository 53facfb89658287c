"""What the ledger's queries answer with: SQL's rows as plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from seckill.domain.events import EventKind
from seckill.domain.items import ItemRecord, Stock
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus
from seckill.domain.shards import home_shard


@dataclass(frozen=True, slots=True, kw_only=True)
class LandedOrder:
    """One order row, as landed from the stream."""

    order_id: int
    item_id: int
    buyer: str
    quantity: int
    status: OrderStatus
    release_reason: str | None
    deadline_at: datetime | None
    payment_id: str | None = None  # the payment that paid it
    idempotency_key: str | None = None  # the buyer's key for the purchase
    reserved_at: datetime | None = None
    request_id: str | None = None  # the API request that reserved it


@dataclass(frozen=True, slots=True)
class OrderRecord:
    """One order of an item, as its buyer's order list shows it."""

    order_id: int
    buyer: str
    quantity: int
    status: OrderStatus
    release_reason: str | None


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One landed event, as the reconciler needs it."""

    event_id: str
    event: EventKind
    order_id: int | None
    quantity: int | None
    shard: int = 0  # the stock shard whose stream carried it
    reason: str | None = None  # released, refund_required: why
    at_ms: int = 0  # when Redis emitted it


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemBook:
    """Everything SQL records about one item, read in one snapshot (one transaction)."""

    item: ItemRecord | None
    stock: Stock | None
    orders: dict[int, LandedOrder]
    journal: list[JournalRow]
    archived: bool = False  # the item left Redis: SQL is its whole record
    refunds: dict[str, RefundRecord] = field(default_factory=dict)  # by payment id
    # The notices answered for the item once archived (by payment id); none while it is live.
    payments: dict[str, PaymentRecord] = field(default_factory=dict)

    @property
    def units_held(self) -> int:
        """Units its orders hold (not paid, not released)."""
        return sum(o.quantity for o in self.orders.values() if o.status is OrderStatus.HELD)

    def for_shard(self, shard: int, shards: int) -> ItemBook:
        """The part of the record one stock shard's stream wrote: its buyers' orders and its
        events. No inventory: that is the item's, checked once (``stock`` None)."""
        return ItemBook(
            item=self.item,
            stock=None,
            orders={
                order_id: order
                for order_id, order in self.orders.items()
                if home_shard(order.buyer, shards) == shard
            },
            journal=[row for row in self.journal if row.shard == shard],
            archived=self.archived,
            refunds={p: r for p, r in self.refunds.items() if r.shard == shard},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairRecord:
    """One repair the reconciler made, as its journal keeps it."""

    item_id: int
    kind: str  # the drift it repairs
    subject: str  # an order id, a counter, the item
    action: str  # what was done, and which side won
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRebuilt:
    """When an item was created, archived (None: not) and last rebuilt in Redis from SQL (None:
    never), as SQL keeps them: what tells an order Redis lost from an id never issued."""

    created_at: datetime
    archived_at: datetime | None
    rebuilt_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PaymentRecord:
    """A payment provider's notice and the answer it got (``outcome``, ``reason``), as recorded
    once per payment id: in Redis while the item is live, in SQL once it is archived."""

    payment_id: str
    item_id: int
    order_id: int
    succeeded: bool
    outcome: str
    reason: str | None
    charged: Money | None = None  # None: recorded before notices carried their charge


@dataclass(frozen=True, slots=True, kw_only=True)
class RefundRecord:
    """A refund owed: a successful charge that paid nothing, one per payment (see
    ``tables.Refund``). ``refunded_at``: when an operator marked the money given back."""

    id: int
    item_id: int
    payment_id: str
    order_id: int  # as the notice named it
    buyer: str | None  # None: a refund for an order nobody knows (unknown_order)
    quantity: int | None
    amount_cents: int  # the sum charged
    currency: str
    reason: str
    shard: int
    event_id: str  # the `refund_required` event it landed from
    owed_at: datetime
    refunded_at: datetime | None

    @property
    def charged(self) -> Money:
        return Money(self.amount_cents, self.currency)

    @property
    def state(self) -> str:
        return "owed" if self.refunded_at is None else "refunded"
