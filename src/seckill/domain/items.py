"""Sale items and their stock counters."""

from __future__ import annotations

from dataclasses import dataclass

from seckill.domain import rules


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

    def __post_init__(self) -> None:
        rules.check_item_id(self.item_id)
        rules.check_sale_item(
            total=self.total,
            starts_at_ms=self.starts_at_ms,
            ends_at_ms=self.ends_at_ms,
            per_buyer_limit=self.per_buyer_limit,
            hold_ms=self.hold_ms,
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
