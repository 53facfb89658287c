"""Money: every successful charge ends as exactly one of a sale (the payment of its order, with
the order's sum) or a refund owed (for that payment, of the sum charged), and a payment id belongs
to one order of its item.

``account`` is the one statement of that rule, a pure function over what one side records: the
audit asks it of Redis (the payment records and the holds), of SQL (the orders' payments and the
refunds, and an archived item's notices), and the demo of what the crowd was told.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class RefundState(StrEnum):
    """A refund owed until an operator marks the money given back."""

    OWED = "owed"
    REFUNDED = "refunded"


# ISO 4217 currencies whose minor unit is not a hundredth: none (JPY) or a thousandth (KWD).
_ZERO = ("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI")
_DECIMALS = {
    **dict.fromkeys((*_ZERO, "VND", "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
}


@dataclass(frozen=True, slots=True)
class Money:
    """A sum: whole minor units (cents) of an ISO 4217 currency."""

    cents: int
    currency: str

    def __str__(self) -> str:
        """As people read it: ``12.50 EUR``, ``1250 JPY``."""
        decimals = _DECIMALS.get(self.currency, 2)
        whole, part = divmod(self.cents, 10**decimals)
        if not decimals:
            return f"{whole} {self.currency}"
        return f"{whole}.{part:0{decimals}d} {self.currency}"

    def times(self, units: int) -> Money:
        return Money(self.cents * units, self.currency)


@dataclass(frozen=True, slots=True)
class Charge:
    """A successful payment as recorded under its id: it paid ``order_id``, or (``refund``) a
    refund is owed for it. ``amount``: what the provider took (None: recorded without it)."""

    payment_id: str
    order_id: int
    refund: bool
    reason: str | None = None  # a refund's
    amount: Money | None = None


@dataclass(frozen=True, slots=True)
class Accounts:
    """How the charges add up: ``unaccounted`` and ``reused`` name what breaks the rule."""

    sales: int
    refunds: int
    unaccounted: list[str] = field(default_factory=list)  # "<payment id>: why"
    reused: list[str] = field(default_factory=list)  # "<payment id>: orders a, b"

    @property
    def balanced(self) -> bool:
        return not self.unaccounted and not self.reused

    def summary(self) -> str:
        text = (
            f"{self.sales} sales, {self.refunds} refunds owed, {len(self.unaccounted)} unaccounted"
        )
        if self.reused:
            text += f", {len(self.reused)} payment ids on two orders"
        problems = [*self.reused, *self.unaccounted]
        return text + (": " + "; ".join(problems[:3]) if problems else "")


def account(
    charges: Iterable[Charge],
    *,
    paid_by: Mapping[int, str | None],
    refunds: Mapping[str, int],
    order_sums: Mapping[int, Money] | None = None,
    refund_sums: Mapping[str, Money] | None = None,
) -> Accounts:
    """Check the charges recorded against the orders and refunds kept.

    ``paid_by``: each paid order and the payment that paid it (None: it names none);
    ``refunds``: each refund owed, by payment id, and its order. A charge is a sale when its
    order is paid by it, a refund when that refund is kept; a paid order with no such charge,
    or a refund with none, is unaccounted too; a payment id that names two orders is reused.

    Sums, where both sides know them: a sale's charge is its order's sum (``order_sums``), and
    a refund owed is of the sum charged (``refund_sums``, by payment id); any other is
    unaccounted."""
    order_sums = order_sums or {}
    refund_sums = refund_sums or {}
    orders_of: dict[str, set[int]] = defaultdict(set)
    recorded: dict[str, Charge] = {}
    for charge in charges:
        orders_of[charge.payment_id].add(charge.order_id)
        recorded[charge.payment_id] = charge
    for order_id, payment_id in paid_by.items():
        if payment_id is not None:
            orders_of[payment_id].add(order_id)
    for payment_id, order_id in refunds.items():
        orders_of[payment_id].add(order_id)
    reused = sorted(
        f"{payment_id}: orders {', '.join(map(str, sorted(orders)))}"
        for payment_id, orders in orders_of.items()
        if len(orders) > 1
    )
    unaccounted: list[str] = []
    sales = refunded = 0
    for payment_id, charge in sorted(recorded.items()):
        if charge.refund:
            owed = refund_sums.get(payment_id)
            if refunds.get(payment_id) != charge.order_id:
                unaccounted.append(f"{payment_id}: a refund for order {charge.order_id}, not kept")
            elif charge.amount and owed and owed != charge.amount:
                unaccounted.append(f"{payment_id}: charged {charge.amount}, a refund of {owed}")
            else:
                refunded += 1
        elif paid_by.get(charge.order_id) == payment_id:
            costs = order_sums.get(charge.order_id)
            if charge.amount and costs and costs != charge.amount:
                unaccounted.append(
                    f"{payment_id}: charged {charge.amount} for order {charge.order_id}, "
                    f"which costs {costs}"
                )
            else:
                sales += 1
        else:
            unaccounted.append(f"{payment_id}: paid order {charge.order_id}, which it did not pay")
    for order_id, payment_id in sorted(paid_by.items()):
        if payment_id is None or payment_id not in recorded:
            unaccounted.append(f"{payment_id}: order {order_id} paid with no charge recorded")
    for payment_id, order_id in sorted(refunds.items()):
        if payment_id not in recorded:
            unaccounted.append(f"{payment_id}: a refund for order {order_id} with no charge")
    return Accounts(sales, refunded, unaccounted, reused)
