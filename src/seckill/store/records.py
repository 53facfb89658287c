"""What the ledger's queries answer with: SQL's rows as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from seckill.domain.events import EventKind
from seckill.domain.items import ItemRecord, Stock
from seckill.domain.orders import OrderStatus


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


@dataclass(frozen=True, slots=True)
class OrderRecord:
    """One order of an item, as its buyer's order list shows it."""

    order_id: int
    buyer: str
    quantity: int
    status: OrderStatus
    release_reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterRecord:
    """A stream entry the persister gave up on, with why, and whether it was replayed since."""

    id: int
    stream: str
    entry_id: str
    payload: dict[str, str]
    error: str
    deliveries: int
    created_at: datetime
    replayed_at: datetime | None


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One landed event, as the reconciler needs it."""

    event_id: str
    event: EventKind
    order_id: int | None
    quantity: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemBook:
    """Everything SQL records about one item, read in one snapshot (one transaction)."""

    item: ItemRecord | None
    stock: Stock | None
    orders: dict[int, LandedOrder]
    journal: list[JournalRow]


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairRecord:
    """One repair the reconciler made, as its journal keeps it."""

    item_id: int
    kind: str  # the drift it repairs
    subject: str  # an order id, a counter, the item
    action: str  # what was done, and which side won
    detail: str
