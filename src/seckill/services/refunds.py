"""Refunds owed: the successful charges that paid nothing, listed for the operator who gives the
money back, and marked refunded once that is done (once: marking again changes nothing)."""

from __future__ import annotations

from seckill.domain import rules
from seckill.domain.money import RefundState
from seckill.services.paging import DEFAULT_PAGE, page_size
from seckill.store.ledger import Ledger
from seckill.store.payments import RefundPage
from seckill.store.records import RefundRecord


class RefundNotFound(LookupError):
    """No refund is owed for that payment of that item."""


async def list_refunds(
    ledger: Ledger,
    *,
    item_id: int | None = None,
    state: RefundState | None = None,
    cursor: int | None = None,
    limit: int = DEFAULT_PAGE,
) -> RefundPage:
    """One page of refunds, newest first; ``cursor``: the previous page's ``next_cursor``."""
    if item_id is not None:
        rules.check_item_id(item_id)
    return await ledger.payments.refunds(
        item_id=item_id, state=state, before=cursor, limit=page_size(limit)
    )


async def mark_refunded(ledger: Ledger, item_id: int, payment_id: str) -> RefundRecord:
    """The money of this payment's refund was given back (idempotent: the first time stays)."""
    rules.check_item_id(item_id)
    rules.check_payment_id(payment_id)
    marked = await ledger.payments.mark_refunded(item_id, payment_id)
    if marked is None:
        raise RefundNotFound(f"no refund is owed for payment {payment_id} of item {item_id}")
    return marked
