"""Orders: their statuses, and how stream events move them (and the item's stock) forward.

An event moves an order forward (absent -> held -> paid | released -> refund_required), and the
transition says how each unit of stock moves. A refund owed for a duplicate charge (a paid order
charged again) is the extra payment's, not the order's: the order stays paid, and the event
moves nothing (``moves_order``). Events of one order may arrive in any order and
any number of times, so a transition happens at most once and a status never moves backwards:
an event that finds the order already at or past where it leads does nothing. SQL lands events
by this table, and the reconciler folds journals through it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from seckill.domain.events import ORDER_KEPT, BadEvent, EventKind


class OrderStatus(StrEnum):
    """An order's status: the same words in the orders table, the API and the scripts."""

    HELD = "held"
    PAID = "paid"
    RELEASED = "released"
    # A payment that came after the release: the money goes back, the stock is never sold.
    REFUND_REQUIRED = "refund_required"


class Moves(NamedTuple):
    """How each unit of an order moves the item's counters in one transition."""

    available: int
    held: int
    sold: int


NO_MOVES = Moves(0, 0, 0)

# (status before, event) -> (status after, how each unit moves). None: the order has no row yet.
TRANSITIONS: dict[tuple[OrderStatus | None, EventKind], tuple[OrderStatus, Moves]] = {
    (None, EventKind.RESERVED): (OrderStatus.HELD, Moves(-1, +1, 0)),
    # Its `reserved` lands later, as a no-op.
    (None, EventKind.PAID): (OrderStatus.PAID, Moves(-1, 0, +1)),
    (None, EventKind.RELEASED): (OrderStatus.RELEASED, NO_MOVES),
    (OrderStatus.HELD, EventKind.PAID): (OrderStatus.PAID, Moves(0, -1, +1)),
    (OrderStatus.HELD, EventKind.RELEASED): (OrderStatus.RELEASED, Moves(+1, -1, 0)),
    # Of the release and the refund, whichever lands second moves nothing: a refund that finds
    # the order still held moves its units back itself.
    (None, EventKind.REFUND_REQUIRED): (OrderStatus.REFUND_REQUIRED, NO_MOVES),
    (OrderStatus.HELD, EventKind.REFUND_REQUIRED): (OrderStatus.REFUND_REQUIRED, Moves(+1, -1, 0)),
    (OrderStatus.RELEASED, EventKind.REFUND_REQUIRED): (OrderStatus.REFUND_REQUIRED, NO_MOVES),
}
# Already at or past where the event leads: nothing to do.
NO_OPS: frozenset[tuple[OrderStatus, EventKind]] = frozenset(
    {
        *((status, EventKind.RESERVED) for status in OrderStatus),
        (OrderStatus.PAID, EventKind.PAID),
        (OrderStatus.RELEASED, EventKind.RELEASED),
        (OrderStatus.REFUND_REQUIRED, EventKind.RELEASED),
        (OrderStatus.REFUND_REQUIRED, EventKind.REFUND_REQUIRED),
    }
)
# Statuses in which the order's stock has gone back: it has a released_at (set once).
RELEASED_STATUSES = frozenset({OrderStatus.RELEASED, OrderStatus.REFUND_REQUIRED})


def moves_order(kind: EventKind, reason: str | None) -> bool:
    """Whether an order event takes part in its order's life: all do but a refund owed that
    leaves its order as it is (``ORDER_KEPT``: a duplicate charge, a wrong sum, no such order)."""
    return not (kind is EventKind.REFUND_REQUIRED and reason in ORDER_KEPT)


def transition(status: OrderStatus | None, kind: EventKind) -> tuple[OrderStatus, Moves] | None:
    """The step one event makes an order that is ``status`` (None: no row yet) take: its new
    status and how each unit moves. None when there is nothing to do (the order is already at
    or past where the event leads, or the event is ``loaded``, which belongs to no order);
    BadEvent if the event cannot apply."""
    if kind is EventKind.LOADED or (status, kind) in NO_OPS:
        return None
    step = TRANSITIONS.get((status, kind))
    if step is None:
        raise BadEvent(f"an order that is {status} cannot take a {kind} event")
    return step


def status_after(status: OrderStatus | None, kind: EventKind) -> OrderStatus | None:
    """Where one event leads an order that is ``status`` (None: no row yet), by the table above;
    BadEvent if it cannot apply."""
    step = transition(status, kind)
    return status if step is None else step[0]
