"""What the reconciler looks for: drift between one item's Redis state and its SQL record.

A pure function of two snapshots, taken in this order: Redis atomically (MULTI/EXEC), then SQL
in one transaction. The sale need not stop. Redis is read as of its stream position P (the last
event id it had generated), so:

- an event at or before P that SQL has not landed is *in flight* if it is still in the stream
  (the stream is trimmed only below what the persister acknowledged, and it acknowledges only
  what committed): Redis is SQL plus those events;
- an event after P that SQL already landed happened after the Redis snapshot: SQL is read as of
  P by leaving those out.

So per order: fold SQL's journal up to P and the in-flight events through the same transitions
SQL lands by (``domain.orders``), and the status must be the hold's in Redis. Whatever does not
fold is drift.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from seckill.domain.events import BadEvent, EventKind, stream_position
from seckill.domain.holds import Hold, HoldState
from seckill.domain.money import Accounts, Charge, Money, account
from seckill.domain.orders import TRANSITIONS, OrderStatus, moves_order, status_after
from seckill.engine.audit import audit_snapshot, charges
from seckill.engine.reads import ItemSnapshot
from seckill.store.records import ItemBook, JournalRow, LandedOrder

Position = tuple[int, int]


class Drift(StrEnum):
    """Each kind of disagreement, and which side a repair takes (see ``reconciler``)."""

    ORDER_MISSING_IN_SQL = "order_missing_in_sql"  # Redis accepted it; no event on its way
    ORDER_MISSING_IN_REDIS = "order_missing_in_redis"  # SQL landed it; Redis does not know it
    ORDER_BEHIND_IN_SQL = "order_behind_in_sql"  # Redis moved it on; the event never landed
    ORDER_BEHIND_IN_REDIS = "order_behind_in_redis"  # SQL landed a move Redis has lost
    ORDER_CONFLICT = "order_conflict"  # the two went different ways (paid in one, released...)
    SQL_ORDER_EDITED = "sql_order_edited"  # an order row disagrees with its own journal
    SQL_ORDER_DELETED = "sql_order_deleted"  # an order row is gone; its journal remains
    JOURNAL_GAP = "journal_gap"  # an order row whose `reserved` event the journal lacks
    REDIS_COUNTERS = "redis_counters"  # Redis counters disagree with Redis holds
    SQL_COUNTERS = "sql_counters"  # SQL inventory disagrees with SQL orders
    TOTAL_DIFFERS = "total_differs"  # the item's total differs, no reload on its way
    REDIS_LOST_ITEM = "redis_lost_item"  # SQL has a sale Redis does not have at all
    REDIS_REWOUND = "redis_rewound"  # SQL landed events Redis has not generated yet
    TRANSFER_LOST = "transfer_lost"  # a fenced shard lost one half of a transfer (transfers.py)
    OVERDUE_HOLDS = "overdue_holds"  # held past their deadline by more than the grace
    DEAD_LETTERS = "dead_letters"  # entries the persister gave up on, not replayed
    REFUND_MISSING_IN_SQL = "refund_missing_in_sql"  # Redis owes it; no event on its way
    REFUND_MISSING_IN_REDIS = "refund_missing_in_redis"  # SQL landed it; Redis does not know it
    PAYMENT_REUSED = "payment_reused"  # a payment id on two orders
    CHARGE_UNACCOUNTED = "charge_unaccounted"  # a charge neither a sale nor a refund owed
    PAYMENT_ON_TWO_ITEMS = "payment_on_two_items"  # one provider charge on orders of two items


# Drift that only rebuilding the item from SQL repairs: Redis lost acknowledged writes.
REDIS_LOST = frozenset(
    {
        Drift.ORDER_MISSING_IN_REDIS,
        Drift.ORDER_BEHIND_IN_REDIS,
        Drift.REDIS_LOST_ITEM,
        Drift.REDIS_REWOUND,
        Drift.REFUND_MISSING_IN_REDIS,
        Drift.TRANSFER_LOST,
    }
)
# Money drift: the charges of one side, or the two sides' refunds and payments, disagree.
MONEY_DRIFT = frozenset(
    {
        Drift.REFUND_MISSING_IN_SQL,
        Drift.REFUND_MISSING_IN_REDIS,
        Drift.PAYMENT_REUSED,
        Drift.CHARGE_UNACCOUNTED,
        Drift.PAYMENT_ON_TWO_ITEMS,
    }
)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Drift
    subject: str  # "order 123", a counter check, "item"
    redis: str  # what Redis says
    sql: str  # what SQL says
    detail: str = ""
    order_id: int | None = None
    shard: int = 0  # the stock shard it was found on (0 for an unsharded item)
    payment_id: str | None = None


def _later_statuses() -> dict[OrderStatus | None, frozenset[OrderStatus]]:
    """Each status and every status an order can reach from it, by the order transitions."""
    steps: dict[OrderStatus | None, set[OrderStatus]] = defaultdict(set)
    for (before, _), (after, _) in TRANSITIONS.items():
        steps[before].add(after)
    reach: dict[OrderStatus | None, frozenset[OrderStatus]] = {}
    for start in [None, *{after for after, _ in TRANSITIONS.values()}]:
        seen: set[OrderStatus] = set()
        todo = list(steps[start])
        while todo:
            status = todo.pop()
            if status not in seen:
                seen.add(status)
                todo += steps[status]
        reach[start] = frozenset(seen)
    return reach


LATER = _later_statuses()


def fold(kinds: list[tuple[Position, EventKind]]) -> OrderStatus | None:
    """An order's status after these events, applied in stream order."""
    status: OrderStatus | None = None
    for _, kind in sorted(kinds):
        status = status_after(status, kind)
    return status


def find_drift(
    snapshot: ItemSnapshot,
    book: ItemBook,
    *,
    redis_position_now: str,
    dead_letters: int,
    grace_ms: int,
) -> list[Finding]:
    """Every disagreement between one item's Redis snapshot and its SQL book (read after it).

    ``redis_position_now``: the stream's last id read after the book; SQL can never have landed
    an event beyond it unless Redis went back in time. ``grace_ms``: how long past its deadline
    a hold may stay held (the reaper's interval and some slack) before it counts as overdue.
    """
    findings: list[Finding] = []
    newest_landed = max((stream_position(r.event_id) for r in book.journal), default=(0, 0))
    if snapshot.item is None:
        if book.journal or book.orders:
            findings.append(
                Finding(
                    Drift.REDIS_LOST_ITEM,
                    "item",
                    "not loaded",
                    f"{len(book.orders)} orders, journal up to {_show(newest_landed)}",
                )
            )
        return findings + sql_findings(book) + dead_letter_findings(dead_letters)
    position = stream_position(snapshot.last_event_id)
    if newest_landed > stream_position(redis_position_now):
        # Nothing SQL landed is "after the snapshot" then: compare with all of it, so every
        # order Redis lost shows.
        position = newest_landed
        findings.append(
            Finding(
                Drift.REDIS_REWOUND,
                "stream",
                f"last id {redis_position_now}",
                f"landed up to {_show(newest_landed)}",
                "Redis restarted from older data: it lost writes it had acknowledged",
            )
        )
    findings += _order_findings(snapshot, book, position)
    findings += _payment_findings(snapshot, book, position)
    findings += _redis_counter_findings(snapshot)
    findings += sql_findings(book)
    findings += _total_findings(snapshot, book)
    overdue = sorted(o for o, due in snapshot.deadlines.items() if due < snapshot.now_ms - grace_ms)
    if overdue:
        shown = ", ".join(map(str, overdue[:5])) + (" ..." if len(overdue) > 5 else "")
        findings.append(
            Finding(
                Drift.OVERDUE_HOLDS,
                f"{len(overdue)} holds",
                "held past deadline",
                "-",
                f"orders {shown}",
            )
        )
    return findings + dead_letter_findings(dead_letters)


def _order_findings(snapshot: ItemSnapshot, book: ItemBook, position: Position) -> list[Finding]:
    landed = {r.event_id for r in book.journal}
    # The events of each order's life (a refund for a duplicate charge is its payment's).
    journal: dict[int, list[JournalRow]] = defaultdict(list)
    for r in book.journal:
        if r.order_id is not None and moves_order(r.event, r.reason):
            journal[r.order_id].append(r)
    in_flight: dict[int, list[tuple[Position, EventKind]]] = defaultdict(list)
    for entry_id, fields in snapshot.events:
        if entry_id not in landed and fields.get("order_id", "").isdigit():
            event = EventKind(fields["event"])
            if moves_order(event, fields.get("reason")):
                in_flight[int(fields["order_id"])].append((stream_position(entry_id), event))

    findings = []
    for order_id in sorted(snapshot.holds.keys() | book.orders.keys() | journal.keys()):
        hold = snapshot.holds.get(order_id)
        row = book.orders.get(order_id)
        rows = [(stream_position(r.event_id), r.event) for r in journal[order_id]]
        subject = f"order {order_id}"
        try:
            expected = fold([r for r in rows if r[0] <= position] + in_flight[order_id])
            recorded = fold(rows)
        except BadEvent as exc:
            findings.append(Finding(Drift.ORDER_CONFLICT, subject, "-", "-", str(exc), order_id))
            continue
        in_redis = hold.order_status if hold else None
        in_sql = row.status if row else None
        reserved = any(r.event is EventKind.RESERVED for r in journal[order_id]) or any(
            kind is EventKind.RESERVED for _, kind in in_flight[order_id]
        )
        if row is not None and not reserved:
            # A later event landed first and its `reserved` never came (parked, then lost with
            # a Redis that went back): the row is right, its journal is not whole.
            findings.append(
                Finding(
                    Drift.JOURNAL_GAP, subject, _order(hold), _row(row),
                    "no `reserved` event in the journal, none on its way", order_id,
                )
            )  # fmt: skip
        if row is None and recorded is not None:
            findings.append(
                Finding(
                    Drift.SQL_ORDER_DELETED,
                    subject,
                    _order(hold),
                    "absent",
                    f"its journal says {recorded}; the row is gone",
                    order_id,
                )
            )
        if row is not None and (
            recorded != row.status
            or any(r.quantity != row.quantity for r in journal[order_id] if r.quantity)
            or (hold is not None and hold.buyer != row.buyer)
        ):
            findings.append(
                Finding(
                    Drift.SQL_ORDER_EDITED,
                    subject,
                    _order(hold),
                    _row(row),
                    f"its journal says {recorded}",
                    order_id,
                )
            )
        if expected == in_redis:
            continue
        if expected is None:
            kind = Drift.ORDER_MISSING_IN_SQL
        elif in_redis is None:
            kind = Drift.ORDER_MISSING_IN_REDIS
        elif in_redis in LATER[expected]:
            kind = Drift.ORDER_BEHIND_IN_SQL
        elif expected in LATER[in_redis]:
            kind = Drift.ORDER_BEHIND_IN_REDIS
        else:
            kind = Drift.ORDER_CONFLICT
        detail = f"SQL as of Redis's position: {expected}" + (
            f" ({len(in_flight[order_id])} events in flight)" if in_flight[order_id] else ""
        )
        findings.append(Finding(kind, subject, _order(hold), in_sql or "absent", detail, order_id))
    return findings


def _payment_findings(snapshot: ItemSnapshot, book: ItemBook, position: Position) -> list[Finding]:
    """One shard's refunds owed and paid orders' payments, Redis against SQL as of Redis's
    position (a refund journaled and not landed yet is on its way)."""
    landed = {r.event_id for r in book.journal}
    on_its_way = {
        fields.get("payment_id")
        for entry_id, fields in snapshot.events
        if entry_id not in landed and fields.get("event") == EventKind.REFUND_REQUIRED
    }
    in_redis = {c.payment_id: c for c in charges([snapshot]) if c.refund}
    in_sql = {
        payment_id: refund
        for payment_id, refund in book.refunds.items()
        if stream_position(refund.event_id) <= position
    }
    findings = [
        Finding(
            Drift.REFUND_MISSING_IN_SQL, f"payment {payment_id}", f"refund owed: {c.reason}",
            "absent", f"order {c.order_id}", c.order_id, payment_id=payment_id,
        )
        for payment_id, c in sorted(in_redis.items())
        if payment_id not in book.refunds and payment_id not in on_its_way
    ] + [
        Finding(
            Drift.REFUND_MISSING_IN_REDIS, f"payment {payment_id}", "absent",
            f"refund owed: {r.reason}", f"order {r.order_id}", r.order_id, payment_id=payment_id,
        )
        for payment_id, r in sorted(in_sql.items())
        if payment_id not in in_redis
    ]  # fmt: skip
    for order_id, hold in sorted(snapshot.holds.items()):
        row = book.orders.get(order_id)
        if row is None or hold.state is not HoldState.PAID or row.status is not OrderStatus.PAID:
            continue
        if hold.payment_id != row.payment_id:
            findings.append(
                Finding(
                    Drift.CHARGE_UNACCOUNTED, f"order {order_id}",
                    f"paid by {hold.payment_id}", f"paid by {row.payment_id}",
                    "the two sides name different payments", order_id,
                )
            )  # fmt: skip
    return findings


def money_findings(accounts: Accounts, side: str) -> list[Finding]:
    """One side's charges that break the money rule (``domain.money``), as drift."""
    return [
        Finding(Drift.PAYMENT_REUSED, f"payment {p.split(':')[0]}", side, "-", p)
        for p in accounts.reused
    ] + [
        Finding(Drift.CHARGE_UNACCOUNTED, f"payment {p.split(':')[0]}", side, "-", p)
        for p in accounts.unaccounted
    ]


def payment_ids(book: ItemBook) -> set[str]:
    """Every payment id SQL records a charge of on the item: paid orders, refunds owed, an
    archived item's successful notices."""
    paid = {o.payment_id for o in book.orders.values() if o.payment_id is not None}
    noticed = {p.payment_id for p in book.payments.values() if p.succeeded}
    return paid | set(book.refunds) | noticed


def cross_item_findings(
    item_id: int, book: ItemBook, charged_on: Mapping[str, set[tuple[int, int]]]
) -> list[Finding]:
    """The item's payment ids that charged orders of another item too (a provider's ids are
    global; a shop that sent the wrong item id with a charge had it pay twice)."""
    findings = []
    for payment_id in sorted(payment_ids(book)):
        charges = charged_on.get(payment_id, set())
        if {item for item, _ in charges} - {item_id}:
            where = "; ".join(f"item {item} order {order}" for item, order in sorted(charges))
            findings.append(
                Finding(Drift.PAYMENT_ON_TWO_ITEMS, f"payment {payment_id}", "-", where,
                        payment_id=payment_id)
            )  # fmt: skip
    return findings


def sql_accounts(book: ItemBook) -> Accounts:
    """SQL's charges: a live item's are its paid orders' payments and its refunds owed; an
    archived item's are its payment notices too, each checked against those."""
    paid_by = {
        o.order_id: o.payment_id for o in book.orders.values() if o.status is OrderStatus.PAID
    }
    refunds = {p: r.order_id for p, r in book.refunds.items()}
    refund_sums = {p: r.charged for p, r in book.refunds.items()}
    if book.archived:
        found = [
            Charge(p.payment_id, p.order_id, p.outcome == "refund_required", p.reason, p.charged)
            for p in book.payments.values()
            if p.succeeded and p.outcome in ("paid", "refund_required")
        ]
        item = book.item
        price = Money(item.price_cents, item.currency) if item else None
        order_sums = {o.order_id: price.times(o.quantity) for o in book.orders.values() if price}
        return account(
            found, paid_by=paid_by, refunds=refunds, order_sums=order_sums, refund_sums=refund_sums
        )
    derived = [Charge(p, o, False) for o, p in paid_by.items() if p is not None] + [
        Charge(p, o, True) for p, o in refunds.items()
    ]
    return account(derived, paid_by=paid_by, refunds=refunds)


def _redis_counter_findings(snapshot: ItemSnapshot) -> list[Finding]:
    return [
        Finding(Drift.REDIS_COUNTERS, check.name, check.detail, "-")
        for check in audit_snapshot(snapshot, journal=False, money=False)
        if not check.ok
    ]


def sql_findings(book: ItemBook) -> list[Finding]:
    """The SQL inventory against its own orders (an item's, whatever its shards)."""
    if book.stock is None:
        return []
    units = Counter[OrderStatus]()
    for order in book.orders.values():
        units[order.status] += order.quantity
    stock, held, paid = book.stock, units[OrderStatus.HELD], units[OrderStatus.PAID]
    if (stock.held, stock.sold) == (held, paid) and stock.balanced:
        return []
    counters = f"held {stock.held}, sold {stock.sold}, available {stock.available} of {stock.total}"
    orders = f"its orders hold {held} and paid {paid}"
    return [Finding(Drift.SQL_COUNTERS, "inventory", "-", counters, orders)]


def _total_findings(snapshot: ItemSnapshot, book: ItemBook) -> list[Finding]:
    # The item's total (on a stock shard, its own counters count the shard's part).
    if snapshot.item is None or book.stock is None or snapshot.item.total == book.stock.total:
        return []
    landed = {row.event_id for row in book.journal}
    reload_in_flight = any(
        f.get("event") == EventKind.LOADED and entry_id not in landed
        for entry_id, f in snapshot.events
    )
    position = stream_position(snapshot.last_event_id)
    reload_after = any(
        r.event is EventKind.LOADED and stream_position(r.event_id) > position for r in book.journal
    )
    if reload_in_flight or reload_after:
        return []
    return [Finding(Drift.TOTAL_DIFFERS, "total", str(snapshot.item.total), str(book.stock.total))]


def journal_gaps(book: ItemBook) -> list[Finding]:
    """Order rows whose `reserved` event the journal lacks, by SQL alone (an archived item's:
    nothing can be on its way any more)."""
    reserved = {r.order_id for r in book.journal if r.event is EventKind.RESERVED}
    return [
        Finding(
            Drift.JOURNAL_GAP, f"order {order_id}", "-", _row(row),
            "no `reserved` event in the journal", order_id,
        )
        for order_id, row in sorted(book.orders.items())
        if order_id not in reserved
    ]  # fmt: skip


def dead_letter_findings(count: int) -> list[Finding]:
    if not count:
        return []
    return [
        Finding(
            Drift.DEAD_LETTERS,
            f"{count} entries",
            "-",
            "not replayed",
            "see `seckill dead-letters list`",
        )
    ]


def _order(hold: Hold | None) -> str:
    return "absent" if hold is None else f"{hold.order_status}: {hold.quantity} x {hold.buyer}"


def _row(row: LandedOrder) -> str:
    return f"{row.status}: {row.quantity} x {row.buyer}"


def _show(position: Position) -> str:
    return f"{position[0]}-{position[1]}"
