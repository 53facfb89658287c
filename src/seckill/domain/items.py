"""Sale items and their stock counters: as an admin creates them, as SQL records them, and as
the engine sells them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from seckill.domain import rules
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.domain.times import datetime_to_ms

# The counters' names, in Stock's order: Redis hash fields and inventory columns alike.
STOCK_FIELDS = ("total", "available", "held", "sold")


@dataclass(frozen=True, slots=True, kw_only=True)
class SaleItem:
    """What the engine needs to sell one item: stock, window, per-buyer limit, hold duration.

    Times are milliseconds since the Unix epoch; the window is ``[starts_at_ms, ends_at_ms)``.
    Construction validates, so an invalid item never reaches Redis.
    """

    item_id: int
    total: int
    starts_at_ms: int
    ends_at_ms: int
    per_buyer_limit: int
    hold_ms: int
    stock_shards: int = 1  # slots the stock is split over (see domain.shards)
    # Its waiting room: tickets only to buyers whose turn came. The pace and the opening lead
    # are the deployment's unless set here.
    waiting_room: bool = False
    queue_admit_per_second: int | None = None
    queue_open_seconds: int | None = None

    def __post_init__(self) -> None:
        rules.check_item_id(self.item_id)
        _check_queue(self.queue_admit_per_second, self.queue_open_seconds)
        rules.check_sale_item(
            total=self.total,
            starts_at_ms=self.starts_at_ms,
            ends_at_ms=self.ends_at_ms,
            per_buyer_limit=self.per_buyer_limit,
            hold_ms=self.hold_ms,
            stock_shards=self.stock_shards,
        )


@dataclass(frozen=True, slots=True)
class Stock:
    """One consistent reading of an item's counters: ``available + held + sold == total``."""

    total: int
    available: int
    held: int
    sold: int

    @property
    def balanced(self) -> bool:
        parts = (self.available, self.held, self.sold)
        return all(p >= 0 for p in parts) and sum(parts) == self.total


@dataclass(frozen=True, slots=True, kw_only=True)
class SaleTerms:
    """What an admin says of an item: name, price, stock, sale window, per-buyer limit and time
    to pay. The same names are the items table's columns."""

    name: str
    price_cents: int  # of one unit, in minor units of ``currency``
    total: int
    starts_at: datetime
    ends_at: datetime
    per_buyer_limit: int
    hold_seconds: int
    stock_shards: int = 1
    waiting_room: bool = False
    queue_admit_per_second: int | None = None  # None: the deployment's
    queue_open_seconds: int | None = None  # None: the deployment's
    currency: str = rules.DEFAULT_CURRENCY  # ISO 4217; every charge for the item is in it


SALE_TERMS = tuple(f.name for f in fields(SaleTerms))


@dataclass(frozen=True, slots=True, kw_only=True)
class NewItem(SaleTerms):
    """An item to put on sale, as an admin describes it. Construction validates."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 200:
            raise InvalidRequest(ErrorCode.INVALID_ITEM, "name must be 1 to 200 characters")
        if rules.has_control_character(self.name):
            raise InvalidRequest(ErrorCode.INVALID_ITEM, "name must hold no control character")
        if not isinstance(self.price_cents, int) or not 0 <= self.price_cents <= MAX_PRICE:
            raise InvalidRequest(
                ErrorCode.INVALID_ITEM, f"price must be whole minor units from 0 to {MAX_PRICE}"
            )
        rules.check_currency(self.currency)
        if self.starts_at.tzinfo is None or self.ends_at.tzinfo is None:
            raise InvalidRequest(ErrorCode.INVALID_ITEM, "sale window times need a time zone")
        rules.check_sale_item(
            total=self.total,
            starts_at_ms=datetime_to_ms(self.starts_at),
            ends_at_ms=datetime_to_ms(self.ends_at),
            per_buyer_limit=self.per_buyer_limit,
            hold_ms=self.hold_seconds * 1000 if isinstance(self.hold_seconds, int) else None,
            stock_shards=self.stock_shards,
        )
        _check_queue(self.queue_admit_per_second, self.queue_open_seconds)


MAX_PRICE = 10**15  # of one unit, in minor units

# The bounds of the deployment's settings (SECKILL_QUEUE_ADMIT_PER_SECOND, _OPEN_SECONDS).
MAX_ADMIT_PER_SECOND = 1_000_000
MAX_QUEUE_OPEN_SECONDS = 2_592_000


def _check_queue(admit_per_second: int | None, open_seconds: int | None) -> None:
    if admit_per_second is not None and not (
        isinstance(admit_per_second, int) and 0 <= admit_per_second <= MAX_ADMIT_PER_SECOND
    ):
        raise InvalidRequest(
            ErrorCode.INVALID_ITEM,
            f"queue_admit_per_second must be from 0 to {MAX_ADMIT_PER_SECOND}",
        )
    if open_seconds is not None and not (
        isinstance(open_seconds, int) and 0 <= open_seconds <= MAX_QUEUE_OPEN_SECONDS
    ):
        raise InvalidRequest(
            ErrorCode.INVALID_ITEM,
            f"queue_open_seconds must be from 0 to {MAX_QUEUE_OPEN_SECONDS}",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRecord(SaleTerms):
    """An item as SQL records it (its terms and its id): what buyers see, and what warming
    loads. Not validated again: it was, as a NewItem, when it was created."""

    item_id: int

    def sale_item(self) -> SaleItem:
        """The item as the engine sells it: times in milliseconds."""
        return SaleItem(
            item_id=self.item_id,
            total=self.total,
            starts_at_ms=datetime_to_ms(self.starts_at),
            ends_at_ms=datetime_to_ms(self.ends_at),
            per_buyer_limit=self.per_buyer_limit,
            hold_ms=self.hold_seconds * 1000,
            stock_shards=self.stock_shards,
            waiting_room=self.waiting_room,
            queue_admit_per_second=self.queue_admit_per_second,
            queue_open_seconds=self.queue_open_seconds,
        )
