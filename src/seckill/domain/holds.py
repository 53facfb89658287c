"""Holds: stock set aside for one order until it is paid or released."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import Outcome


class HoldState(StrEnum):
    """A hold only moves forward: held -> paid, or held -> released."""

    HELD = "held"
    PAID = "paid"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class Hold:
    """One order's hold. ``refund_required``: a payment succeeded after the hold was released
    (its stock is gone for good), so the money must go back. ``payment_id``: the payment that
    paid it."""

    order_id: int
    buyer: str
    quantity: int
    deadline_ms: int
    state: HoldState
    reason: ReleaseReason | None = None
    refund_required: bool = False
    payment_id: str | None = None

    @property
    def order_status(self) -> OrderStatus:
        """The order's status in the words of the orders table: a released hold paid for after
        all is ``refund_required``."""
        return OrderStatus.REFUND_REQUIRED if self.refund_required else OrderStatus(self.state)


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to one purchase attempt.

    A replay carries the original answer (outcome, order id, deadline) with ``replayed`` set, so
    every repeat of one idempotency key compares equal on what the buyer sees.
    ``retry_after_ms``: set with ``rate_limited``, the time until the buyer's window reopens.
    """

    outcome: Outcome
    order_id: int | None = None
    deadline_ms: int | None = None
    replayed: bool = False
    retry_after_ms: int | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.RESERVED


@dataclass(frozen=True, slots=True)
class HoldTransition:
    """The answer to a release: the outcome, and why the hold was released if it was."""

    outcome: Outcome
    reason: ReleaseReason | None = None


@dataclass(frozen=True, slots=True)
class PaymentSettlement:
    """The answer to a provider's payment notice (``settle_payment``).

    ``reason``: with ``refund_required``, why the charge is owed back; with ``released`` and
    ``already_released``, why the hold was released. ``replayed``: the provider sent this
    payment id before; the answer is the one recorded then, and nothing changed now.
    """

    outcome: Outcome
    reason: ReleaseReason | RefundReason | None = None
    replayed: bool = False

    @property
    def refund_owed(self) -> bool:
        """A successful charge that must go back (it paid nothing)."""
        return self.outcome is Outcome.REFUND_REQUIRED
