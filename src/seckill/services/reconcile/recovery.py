"""Recovery: rebuild an item's Redis state from SQL after Redis lost it.

Redis may come back empty (a restart without persistence, FLUSHALL), from an older AOF (a crash
inside the fsync window) or as a replica that missed the last writes (a failover). SQL has every
event the persister acknowledged; recover.lua merges that record into whatever Redis still has,
in one atomic step per stock shard, so the sale goes on with no unit sold twice: counters, live
holds with their deadlines and buyers' units all come from the merged holds. Each shard rebuilt
is verified again (its fence lifted): it sells.

Given back as well, because SQL has them: each paid order's payment and each refund owed (a
provider's retry is answered as it was), the idempotency record of every order whose key SQL
kept that has not expired (a buyer's retry replays its order, and never holds a second), and
every order event SQL landed past what a shard's stream still has, under its own entry id (a
bridge that had not read it publishes it under the message id it would have had), after every
group SQL registered is made again on the stream, so none misses them.
Not rebuilt, because SQL never had them: rate windows and failed payment notices (a repeat finds
the order released or paid, and answers so).

An item with stock shards is rebuilt whole: each shard's holds merged as above, then each
shard's total set so that they add up to the item's, the transfers between them (in transit or
not) settled by those totals. A shard whose holds SQL did not change keeps the units it had on
sale; the others share what is left, so no unit is lost or counted twice.

Every rebuild is journaled in SQL's ``repairs`` table with its time, the reconciler's and an
operator's (``seckill recover``) alike: an order answered 202 that Redis lost before it landed
is gone on both sides, and a buyer who reads it is told so from that record.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial

from seckill.domain.events import (
    EventKind,
    RefundReason,
    ReleaseReason,
    StockEvent,
    encode_order_event,
    stream_position,
)
from seckill.domain.items import Stock
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.shards import home_shard, split_stock
from seckill.domain.times import datetime_to_ms
from seckill.engine.engine import RedisEngine
from seckill.engine.repairs import RecoveredOrder, RecoveredPayment, Recovery
from seckill.services.items import UnknownItem
from seckill.services.reconcile.drift import REDIS_LOST
from seckill.services.stream_groups import give_back_groups
from seckill.store.ledger import Ledger
from seckill.store.records import ItemBook, JournalRow, LandedOrder, RefundRecord, RepairRecord

log = logging.getLogger(__name__)


# A rebuild is journaled in the ``repairs`` table on the item as a whole, under the drift the
# reconciler found (one of REDIS_LOST) or, asked by an operator (``seckill recover``) without a
# look first, under ``redis_lost``. Its time is what tells a buyer's order Redis lost before SQL
# had it from an id never issued (``services/orders``).
REBUILT_SUBJECT = "item"
ASKED_BY_OPERATOR = "redis_lost"
REBUILT_KINDS = frozenset({ASKED_BY_OPERATOR, *REDIS_LOST})
REBUILT = "rebuilt Redis from SQL (SQL wins: Redis lost acknowledged writes)"


async def recover_item(
    engine: RedisEngine, ledger: Ledger, item_id: int, *, found: Sequence[str] = ()
) -> Recovery:
    """Rebuild ``item_id`` in Redis from its SQL record, merged with what Redis still holds;
    the counters of the whole item as rebuilt. Journaled (``rebuilt``), with the drift
    ``found`` that asked for it, the reconciler's, if any."""
    recovery = await _rebuild(engine, ledger, item_id)
    repair = rebuilt(item_id, found, recovery)
    await ledger.record_repair(repair)
    log.warning("item %d: repaired %s (%s): %s; %s", item_id, repair.kind, repair.subject,
                repair.action, repair.detail)  # fmt: skip
    return recovery


def rebuilt(item_id: int, found: Sequence[str], recovery: Recovery) -> RepairRecord:
    """A rebuild as the ``repairs`` table journals it."""
    why = f"found {', '.join(found)}" if found else "asked by an operator"
    return RepairRecord(
        item_id=item_id,
        kind=found[0] if found else ASKED_BY_OPERATOR,
        subject=REBUILT_SUBJECT,
        action=REBUILT,
        detail=f"{why}; {recovery.restored} holds restored, {recovery.advanced} moved forward, "
        f"{recovery.conflicts} conflicts; now {recovery.stock}",
    )


async def _rebuild(engine: RedisEngine, ledger: Ledger, item_id: int) -> Recovery:
    book = await ledger.book(item_id)
    if book.item is None:
        raise UnknownItem(f"item {item_id} is not in the database")
    if book.archived:
        raise InvalidRequest(
            ErrorCode.ITEM_ARCHIVED,
            f"item {item_id} is archived: its sale is over and SQL is its record",
        )
    item = book.item.sale_item()
    shards = item.stock_shards
    orders: dict[int, list[RecoveredOrder]] = defaultdict(list)
    for order in book.orders.values():
        orders[home_shard(order.buyer, shards)].append(_recovered(order))
    payments = _payments(book, shards)
    newest = {shard: (0, 0) for shard in range(shards)}
    for row in book.journal:
        newest[row.shard] = max(newest[row.shard], stream_position(row.event_id))
    landed = {shard: f"{ms}-{seq}" for shard, (ms, seq) in newest.items()}
    await _give_back_keys(engine, item_id, book)
    # The groups first: a trim between the events' return and a group's making would drop
    # events that group never read (a bridge that was down across the loss).
    await give_back_groups(engine, ledger, item_id, shards)
    await _give_back_events(engine, item_id, book)
    if shards == 1:
        return await engine.recover(
            item, last_landed_id=landed[0], orders=orders[0], payments=payments[0]
        )

    plans = [
        await engine.recover(
            item, shard=shard, last_landed_id=landed[shard], orders=orders[shard],
            payments=payments[shard], plan=True,
        )
        for shard in range(shards)
    ]  # fmt: skip
    committed = [plan.stock.held + plan.stock.sold for plan in plans]
    if sum(committed) > item.total:
        raise InvalidRequest(
            ErrorCode.HOLDS_EXCEED_TOTAL,
            f"held and paid {sum(committed)} over {shards} shards exceed the total {item.total}",
        )
    kept = {}
    for shard, plan in enumerate(plans):
        unchanged = not (plan.restored or plan.advanced or plan.conflicts)
        part = await engine.shard_stock(item_id, shard)
        if unchanged and part is not None:
            kept[shard] = part[0].available
    left = item.total - sum(committed) - sum(kept.values())
    if left < 0:  # the survivors' counts are off too: every shard shares what is left
        kept, left = {}, item.total - sum(committed)
    sharing = [shard for shard in range(shards) if shard not in kept] or [0]
    available = dict(kept)
    for shard, share in zip(sharing, split_stock(left, len(sharing)), strict=True):
        available[shard] = available.get(shard, 0) + share
    done = [
        await engine.recover(
            item, shard=shard, total=committed[shard] + available[shard],
            last_landed_id=landed[shard], orders=orders[shard], payments=payments[shard],
        )
        for shard in range(shards)
    ]  # fmt: skip
    held = sum(r.stock.held for r in done)
    sold = sum(r.stock.sold for r in done)
    return Recovery(
        sum(r.restored for r in done),
        sum(r.advanced for r in done),
        sum(r.conflicts for r in done),
        _stock(item.total, held, sold),
    )


def _recovered(order: LandedOrder) -> RecoveredOrder:
    return RecoveredOrder(
        str(order.order_id),
        order.buyer,
        order.quantity,
        order.status,
        datetime_to_ms(order.deadline_at) if order.deadline_at else 0,
        order.release_reason,
        order.payment_id,
    )


def _payments(book: ItemBook, shards: int) -> dict[int, list[RecoveredPayment]]:
    """The successful payments SQL knows, on the shard of their order."""
    out: dict[int, list[RecoveredPayment]] = defaultdict(list)
    for o in book.orders.values():
        if o.status is OrderStatus.PAID and o.payment_id is not None:
            out[home_shard(o.buyer, shards)].append(
                RecoveredPayment(o.payment_id, str(o.order_id), Outcome.PAID.value, None)
            )
    for r in book.refunds.values():
        out[r.shard].append(
            RecoveredPayment(r.payment_id, str(r.order_id), Outcome.REFUND_REQUIRED.value, r.reason)
        )
    return out


async def _give_back_keys(engine: RedisEngine, item_id: int, book: ItemBook) -> None:
    """Write back the idempotency record of every order whose key SQL kept and whose time is
    not up (the engine's idempotency TTL from the order's time), where Redis has none."""
    now_ms = datetime_to_ms(datetime.now(UTC))
    ttl_ms = engine.idempotency_ttl_ms
    shards = book.item.stock_shards if book.item else 1
    async with engine.redis.pipeline(transaction=False) as pipe:
        queued = 0
        for order in book.orders.values():
            if order.idempotency_key is None or order.reserved_at is None:
                continue
            left_ms = ttl_ms - (now_ms - datetime_to_ms(order.reserved_at))
            if left_ms <= 0:
                continue
            keys = engine.keys(item_id, home_shard(order.buyer, shards))
            record = {
                "order_id": str(order.order_id),
                "quantity": order.quantity,
                "deadline_ms": datetime_to_ms(order.deadline_at) if order.deadline_at else 0,
            }
            pipe.set(
                keys.idempotency(order.buyer, order.idempotency_key),
                json.dumps(record, separators=(",", ":")),
                px=left_ms,
                nx=True,
            )
            queued += 1
        if queued:
            await pipe.execute()


async def _give_back_events(engine: RedisEngine, item_id: int, book: ItemBook) -> int:
    """Put back on each shard's stream the order events SQL landed from it past the stream's
    last id (a bridge may not have read them when Redis lost them); how many went back."""
    shards = book.item.stock_shards if book.item else 1
    last = [
        stream_position(entry_id)
        for entry_id in await engine.last_event_ids([(item_id, s) for s in range(shards)])
    ]
    refunds = {(r.shard, r.event_id): r for r in book.refunds.values()}
    lost: dict[int, list[tuple[str, dict[str, str]]]] = defaultdict(list)
    for row in sorted(book.journal, key=lambda r: stream_position(r.event_id)):
        if stream_position(row.event_id) <= last[row.shard]:
            continue
        fields = _entry_fields(item_id, row, book, refunds.get((row.shard, row.event_id)))
        if fields is not None:
            lost[row.shard].append((row.event_id, fields))
    restored = 0
    for shard, entries in lost.items():
        restored += (await engine.restore_events(item_id, shard, entries))[0]
    return restored


def _entry_fields(
    item_id: int, row: JournalRow, book: ItemBook, refund: RefundRecord | None
) -> dict[str, str] | None:
    """The fields of the stream entry an order event was (``encode_order_event``); None for an event
    no broker is sent (loaded, transfers) or one whose order SQL lacks."""
    order = book.orders.get(row.order_id) if row.order_id is not None else None
    if order is None:
        return None
    event = partial(
        StockEvent, event_id=row.event_id, shard=row.shard, kind=row.event, item_id=item_id,
        at_ms=row.at_ms, order_id=order.order_id, buyer=order.buyer,
        quantity=row.quantity or order.quantity,
    )  # fmt: skip
    match row.event:
        case EventKind.RESERVED:
            deadline = datetime_to_ms(order.deadline_at) if order.deadline_at else 0
            return encode_order_event(
                event(deadline_ms=deadline, request_id=order.request_id,
                      idempotency_key=order.idempotency_key)
            )  # fmt: skip
        case EventKind.PAID if order.payment_id is not None:
            return encode_order_event(event(payment_id=order.payment_id))
        case EventKind.RELEASED:
            why = ReleaseReason(row.reason or order.release_reason or ReleaseReason.EXPIRED)
            return encode_order_event(event(reason=why))
        case EventKind.REFUND_REQUIRED if refund is not None:
            owed = RefundReason(refund.reason)
            return encode_order_event(
                event(reason=owed, payment_id=refund.payment_id, amount_cents=refund.amount_cents,
                      currency=refund.currency)
            )  # fmt: skip
    return None


def _stock(total: int, held: int, sold: int) -> Stock:
    return Stock(total, total - held - sold, held, sold)
