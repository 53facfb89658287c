"""An item's life: scheduled -> on sale -> ended -> settled -> archived.

An item is *settled* once its sale has ended and nothing about it is left to happen: no unit
held, every stream entry in every sink, no dead letter waiting for a replay, Redis and SQL
agreeing. A settled item may be *archived* (after a grace period): its Redis keys go and it
leaves the items registry, so workers no longer walk it; SQL keeps its whole record and
answers every read of it from then on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Stage(StrEnum):
    """Where an item is in its life: the same words in the API, the CLI and the docs."""

    SCHEDULED = "scheduled"  # its sale is still to start
    ON_SALE = "on_sale"
    ENDED = "ended"  # its sale is over; something is still to settle
    SETTLED = "settled"  # over and settled: it may be archived
    ARCHIVED = "archived"  # in SQL only


class Unsettled(StrEnum):
    """Why an item cannot be archived yet."""

    NOT_ENDED = "not_ended"  # the sale has not ended
    IN_GRACE = "in_grace"  # ended, but less than the grace period ago
    HELD = "held"  # a hold is still held (not paid, not released)
    BACKLOG = "backlog"  # a sink (the persister, a bridge) has not acknowledged every entry
    DEAD_LETTERS = "dead_letters"  # an entry a sink gave up on, not replayed
    DRIFT = "drift"  # Redis and SQL disagree (the reconciler's findings)
    MOVED = "moved"  # something happened while it was being archived: look again


@dataclass(frozen=True, slots=True)
class Hindrance:
    """One reason an item is not settled, with what was found."""

    reason: Unsettled
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def described(hindrances: list[Hindrance]) -> str:
    """What keeps an item from being settled, in one line."""
    return "; ".join(map(str, hindrances))


def stage(
    *,
    starts_at: datetime,
    ends_at: datetime,
    now: datetime,
    archived: bool,
    hindrances: list[Hindrance],
) -> Stage:
    """The item's stage from its window, whether SQL marks it archived, and what keeps it from
    being settled (ignoring the grace period: an item in its grace is settled, not yet due)."""
    if archived:
        return Stage.ARCHIVED
    if now < starts_at:
        return Stage.SCHEDULED
    if now < ends_at:
        return Stage.ON_SALE
    if any(h.reason is not Unsettled.IN_GRACE for h in hindrances):
        return Stage.ENDED
    return Stage.SETTLED
