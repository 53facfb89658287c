"""Holds: stock set aside for one order until it is paid or released."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from seckill.domain.outcomes import Outcome


class HoldState(StrEnum):
    """A hold only moves forward: held -> paid, or held -> released."""

    HELD = "held"
    PAID = "paid"
    RELEASED = "released"


class ReleaseReason(StrEnum):
    """Why a hold gave its stock back."""

    CANCELLED = "cancelled"
    EXPIRED = "expired"
    PAYMENT_FAILED = "payment_failed"


@dataclass(frozen=True, slots=True)
class Hold:
    order_id: int
    buyer: str
    quantity: int
    deadline_ms: int
    state: HoldState
    reason: ReleaseReason | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to one purchase attempt.

    A replay carries the original answer (outcome, order id, deadline) with ``replayed`` set, so
    every repeat of one idempotency key compares equal on what the buyer sees.
    """

    outcome: Outcome
    order_id: int | None = None
    deadline_ms: int | None = None
    replayed: bool = False

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.RESERVED


@dataclass(frozen=True, slots=True)
class HoldTransition:
    """The answer to confirm or release: the outcome, and why the hold was released if it was."""

    outcome: Outcome
    reason: ReleaseReason | None = None
