"""Redis against SQL as pass/fail checks, for the demo's verdict and the tests.

The reconciler's findings (``drift``), grouped: orders, counters, and the SQL journal's
completeness. The stock check compares the counters directly, so it is exact once the item's
stream is drained; the others hold during a running sale too.
"""

from __future__ import annotations

from collections import Counter

from seckill.domain.items import Stock
from seckill.engine.audit import (
    Check,
    audit_shards,
    audit_snapshot,
    charges,
    journal_check,
    money_check,
)
from seckill.engine.engine import RedisEngine
from seckill.services.reconcile.drift import Drift, sql_accounts
from seckill.services.reconcile.reconciler import NEVER_OVERDUE_MS, Comparison, Reconciler
from seckill.store.ledger import Ledger

REFUND_DRIFT = frozenset({Drift.REFUND_MISSING_IN_SQL, Drift.REFUND_MISSING_IN_REDIS})
ORDER_DRIFT = frozenset(
    {Drift.ORDER_MISSING_IN_SQL, Drift.ORDER_MISSING_IN_REDIS, Drift.ORDER_BEHIND_IN_SQL,
     Drift.ORDER_BEHIND_IN_REDIS, Drift.ORDER_CONFLICT, Drift.SQL_ORDER_EDITED,
     Drift.SQL_ORDER_DELETED}
)  # fmt: skip


async def compare_records(engine: RedisEngine, ledger: Ledger, item_id: int) -> list[Check]:
    return _agreement(await _compare(engine, ledger, item_id))


async def audit_records(engine: RedisEngine, ledger: Ledger, item_id: int) -> list[Check]:
    """Every check on one item from one look: its invariants in Redis (the stream's journal
    left to SQL's, as a persister trims it), then Redis against SQL."""
    compared = await _compare(engine, ledger, item_id)
    if compared.book.archived:
        return _archived(compared)
    snapshots = compared.snapshots
    audited = (
        audit_snapshot(snapshots[0], journal=False)
        if len(snapshots) == 1
        else audit_shards(snapshots, journal=False)
    )
    return audited + _agreement(compared)


async def _compare(engine: RedisEngine, ledger: Ledger, item_id: int) -> Comparison:
    return await Reconciler(engine, ledger, grace_ms=NEVER_OVERDUE_MS).compare(item_id)


def _archived(compared: Comparison) -> list[Check]:
    """An archived item's checks: SQL is its whole record, so against itself."""
    book = compared.book
    held = book.units_held
    shown = "; ".join(f"{f.kind} {f.subject}: {f.sql}" for f in compared.findings[:3])
    return [
        Check("SQL stock balanced", book.stock is not None and book.stock.balanced,
              _stocks(book.stock, book.stock).removeprefix("both ")),
        Check("no order held", not held, f"{held} units held" if held else "none"),
        Check("SQL agrees with itself", not compared.findings,
              shown or f"{len(book.orders)} orders, {len(book.journal)} journal rows"),
        money_check(sql_accounts(book), "SQL: "),
    ]  # fmt: skip


def _agreement(compared: Comparison) -> list[Check]:
    book, findings, holds = compared.book, compared.findings, compared.holds
    orders = [f for f in findings if f.kind in ORDER_DRIFT]
    shown = "; ".join(f"{f.kind} {f.subject}" for f in orders[:3])
    refunds = [f for f in findings if f.kind in REFUND_DRIFT]
    owed_in_redis = sum(c.refund for c in charges(compared.snapshots))
    return [
        Check(
            "every order in SQL",
            not orders,
            f"{len(book.orders)} orders for {len(holds)} holds"
            + (f"; {len(orders)} disagree: {shown}" if orders else ""),
        ),
        Check(
            "SQL stock == Redis stock",
            book.stock == compared.redis_stock,
            _stocks(book.stock, compared.redis_stock),
        ),
        journal_check(
            "SQL", Counter(str(r.event) for r in book.journal), holds.values(), owed_in_redis
        ),
        money_check(sql_accounts(book), "SQL: "),
        Check(
            "refunds owed in SQL == Redis",
            not refunds,
            f"{len(book.refunds)} in SQL, {owed_in_redis} in Redis"
            + "".join(f"; {f.kind} {f.subject}" for f in refunds[:3]),
        ),
    ]


def _stocks(sql: Stock | None, redis: Stock | None) -> str:
    def show(stock: Stock | None) -> str:
        if stock is None:
            return "no such item"
        return f"available {stock.available}, held {stock.held}, sold {stock.sold} of {stock.total}"

    return f"both {show(sql)}" if sql == redis else f"SQL {show(sql)}; Redis {show(redis)}"
