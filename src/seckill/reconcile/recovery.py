"""Recovery: rebuild an item's Redis state from SQL after Redis lost it.

Redis may come back empty (a restart without persistence, FLUSHALL), from an older AOF (a crash
inside the fsync window) or as a replica that missed the last writes (a failover). SQL has every
event the persister acknowledged; recover.lua merges that record into whatever Redis still has,
in one atomic step, so the sale goes on with no unit sold twice: counters, live holds with their
deadlines and buyers' units all come from the merged holds.

The payments SQL knows are recorded again: each paid order's payment and each refund owed, so
a provider's retry is answered as before. What SQL never had is not rebuilt: idempotency records
(a retried key after a loss is decided afresh, within the per-buyer limit), rate windows and
failed payment notices (a repeat finds the order released or paid, and answers so).

Not for an item with stock shards yet: each shard's total depends on the transfers between them,
which a partial loss can split (see docs/stock-shards.md). ``NotRecoverable`` says so.
"""

from __future__ import annotations

from seckill.domain.events import stream_position
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.times import datetime_to_ms
from seckill.engine.engine import RecoveredOrder, RecoveredPayment, Recovery, RedisEngine
from seckill.services.items import UnknownItem
from seckill.store.ledger import Ledger


class NotRecoverable(Exception):
    """The item cannot be rebuilt from SQL by ``recover`` (one with stock shards)."""


async def recover_item(engine: RedisEngine, ledger: Ledger, item_id: int) -> Recovery:
    """Rebuild ``item_id`` in Redis from its SQL record, merged with what Redis still holds."""
    book = await ledger.book(item_id)
    if book.item is None:
        raise UnknownItem(f"item {item_id} is not in the database")
    if book.archived:
        raise InvalidRequest(
            ErrorCode.ITEM_ARCHIVED,
            f"item {item_id} is archived: its sale is over and SQL is its record",
        )
    if book.item.stock_shards > 1:
        raise NotRecoverable(
            f"item {item_id} has {book.item.stock_shards} stock shards: rebuilding it from SQL "
            "is not supported; the reconciler reports its drift, and its Redis must be restored"
        )
    orders = [
        RecoveredOrder(
            str(o.order_id),
            o.buyer,
            o.quantity,
            o.status,
            datetime_to_ms(o.deadline_at) if o.deadline_at else 0,
            o.release_reason,
            o.payment_id,
        )
        for o in book.orders.values()
    ]
    payments = [
        RecoveredPayment(o.payment_id, str(o.order_id), Outcome.PAID.value, None)
        for o in book.orders.values()
        if o.status is OrderStatus.PAID and o.payment_id is not None
    ] + [
        RecoveredPayment(r.payment_id, str(r.order_id), Outcome.REFUND_REQUIRED.value, r.reason)
        for r in book.refunds.values()
    ]
    newest = max((stream_position(r.event_id) for r in book.journal), default=(0, 0))
    return await engine.recover(
        book.item.sale_item(),
        last_landed_id=f"{newest[0]}-{newest[1]}",
        orders=orders,
        payments=payments,
    )
