"""The verdict on a crowd's sale: what the crowd was told, checked against what the system kept.

Read after the sale has settled (no holds left, the stream landed): the item's counters and the
server's own audit through the admin API, every order the crowd was given through the buyer's
own order route, and, when a database URL is given, the order rows in SQL. Each verdict is a
``Check``: a name, pass or fail, and a detail that names what failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from seckill.crowd.client import ApiClient
from seckill.crowd.crowd import CrowdLog, CrowdOrder
from seckill.crowd.plan import CrowdPlan
from seckill.domain.money import Charge, Money, account
from seckill.domain.orders import RELEASED_STATUSES, OrderStatus
from seckill.engine.audit import Check
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.store.records import ItemBook

# Statuses whose units count against the buyer's limit.
LIVE = frozenset({OrderStatus.HELD, OrderStatus.PAID})
_SHOWN = 3  # ids named in a detail


@dataclass(frozen=True, slots=True, kw_only=True)
class SaleEnd:
    """What the system kept, read once the sale settled."""

    counters: dict[str, Any]  # the admin counters route's answer
    back_on_sale: dict[str, Any] | None  # the counters once the first crowd's holds ran out
    server_checks: list[dict[str, Any]] | None  # the admin audit route's checks
    seen: dict[str, dict[str, Any] | None]  # order id -> the buyer's view of it (None: 404)
    refunds: list[dict[str, Any]] | None = None  # the admin refunds route's (None: no answer)
    sql: ItemBook | None = None


async def read_sale_end(
    client: ApiClient,
    item_id: int,
    log: CrowdLog,
    *,
    counters: dict[str, Any],
    back_on_sale: dict[str, Any] | None,
    database_url: str | None,
    database_tls: ssl.SSLContext | None = None,
    concurrency: int,
) -> SaleEnd:
    audited = await client.audit(item_id)
    lanes = asyncio.Semaphore(concurrency)

    async def view(order: CrowdOrder) -> tuple[str, dict[str, Any] | None]:
        async with lanes:
            answer = await client.order(order.buyer, item_id, order.order_id)
        return order.order_id, answer.body if answer.status == 200 else None

    seen = dict(await asyncio.gather(*(view(o) for o in log.orders.values())))
    return SaleEnd(
        counters=counters,
        back_on_sale=back_on_sale,
        server_checks=audited.body.get("checks") if audited.status == 200 else None,
        seen=seen,
        refunds=await client.refunds(item_id),
        sql=await read_book(database_url, item_id, tls=database_tls) if database_url else None,
    )


async def read_book(
    database_url: str, item_id: int, *, tls: ssl.SSLContext | None = None
) -> ItemBook:
    """The item's rows in the deployment's database (over TLS with ``tls``)."""
    database = open_database(database_url, tls=tls)
    try:
        return await Ledger(database).book(item_id)
    finally:
        await database.dispose()


def verdicts(plan: CrowdPlan, log: CrowdLog, end: SaleEnd) -> list[Check]:
    orders = list(log.orders.values())
    return [
        _not_oversold(plan, orders, end),
        _within_limit(plan, orders, end),
        _no_lost_orders(orders, end),
        _no_duplicates(log, orders, end),
        _payments_once(orders, end),
        _charges_accounted(log, end),
        _released_units(orders, end),
        _redis_equals_sql(end),
        _server_audit(end),
    ]


def _units(orders: Iterable[CrowdOrder], statuses: Iterable[str]) -> int:
    wanted = frozenset(statuses)
    return sum(o.quantity for o in orders if o.status in wanted)


def _sides(end: SaleEnd) -> dict[str, dict[str, int]]:
    sides = {"Redis": end.counters.get("redis"), "SQL": end.counters.get("sql")}
    return {name: stock for name, stock in sides.items() if stock is not None}


def _balanced(stock: dict[str, int]) -> bool:
    terms = (stock["available"], stock["held"], stock["sold"])
    return min(terms) >= 0 and sum(terms) == stock["total"]


def _not_oversold(plan: CrowdPlan, orders: list[CrowdOrder], end: SaleEnd) -> Check:
    sides = _sides(end)
    paid = _units(orders, {OrderStatus.PAID})
    ok = len(sides) == 2 and paid <= plan.units
    details = []
    for name, stock in sides.items():
        ok = ok and _balanced(stock) and stock["total"] == plan.units
        details.append(
            f"{name}: available {stock['available']} + held {stock['held']} + sold "
            f"{stock['sold']} of {stock['total']}"
        )
    details += [f"{side} has no such item" for side in ("Redis", "SQL") if side not in sides]
    return Check("not oversold", ok, "; ".join([*details, f"the crowd paid for {paid}"]))


def _within_limit(plan: CrowdPlan, orders: list[CrowdOrder], end: SaleEnd) -> Check:
    limit = plan.per_buyer_limit
    told = Counter[str]()
    for order in orders:
        if order.status in LIVE:
            told[order.buyer] += order.quantity
    over = sorted(b for b, n in told.items() if n > limit)
    detail = f"{len(told)} buyers hold or bought units; {len(over)} over the limit of {limit}"
    if end.sql is not None:
        kept = Counter[str]()
        for row in end.sql.orders.values():
            if row.status in LIVE:
                kept[row.buyer] += row.quantity
        over_sql = sorted(b for b, n in kept.items() if n > limit)
        over += [f"{b} (SQL)" for b in over_sql]
        detail += f" (SQL: {len(over_sql)})"
    if over:
        detail += ": " + ", ".join(over[:_SHOWN])
    return Check("buyers within limit", not over, detail)


def _no_lost_orders(orders: list[CrowdOrder], end: SaleEnd) -> Check:
    problems: list[str] = []
    for order in orders:
        view = end.seen.get(order.order_id)
        if view is None:
            problems.append(f"order {order.order_id} not found by the API")
        elif not _as_told(order, view["status"], view.get("release_reason")):
            problems.append(f"order {order.order_id} is {view['status']}, told {order.status}")
        if end.sql is not None:
            row = end.sql.orders.get(int(order.order_id))
            if row is None:
                problems.append(f"order {order.order_id} missing in SQL")
            elif not _as_told(order, row.status, row.release_reason):
                problems.append(f"order {order.order_id} is {row.status} in SQL")
    where = "the API and SQL" if end.sql is not None else "the API"
    detail = f"{len(orders)} orders answered 202; {len(problems)} problems in {where}"
    if problems:
        detail += ": " + "; ".join(problems[:_SHOWN])
    return Check("no lost orders", not problems, detail)


def _as_told(order: CrowdOrder, status: str, reason: str | None) -> bool:
    """The status the crowd was last told, and the release's reason when it was told one."""
    if status != order.status:
        return False
    return order.status != OrderStatus.RELEASED or order.release_reason in (None, reason)


def _no_duplicates(log: CrowdLog, orders: list[CrowdOrder], end: SaleEnd) -> Check:
    problems = [f"replay differed: {d}" for d in log.replays_differing]
    redis = end.counters.get("redis")
    live = _units(orders, LIVE)
    if redis is not None and redis["held"] + redis["sold"] != live:
        problems.append(f"Redis holds {redis['held'] + redis['sold']} units, the crowd {live}")
    if end.sql is not None:
        known = {int(o.order_id) for o in orders}
        strangers = sorted(set(end.sql.orders) - known)
        problems += [f"order {oid} in SQL, never answered" for oid in strangers]
    detail = (
        f"{log.replays} reservations sent twice with one key; units held or sold equal the "
        f"crowd's ({live})"
    )
    if problems:
        detail = "; ".join(problems[:_SHOWN]) + f" ({len(problems)} problems)"
    return Check("no duplicate orders", not problems, detail)


def _payments_once(orders: list[CrowdOrder], end: SaleEnd) -> Check:
    paid = _units(orders, {OrderStatus.PAID})
    sold = {name: stock["sold"] for name, stock in _sides(end).items()}
    ok = len(sold) == 2 and all(n == paid for n in sold.values())
    shown = ", ".join(f"{name} sold {n}" for name, n in sold.items())
    return Check("payments counted once", ok, f"the crowd paid for {paid} units; {shown}")


def _charges_accounted(log: CrowdLog, end: SaleEnd) -> Check:
    """Every charge the provider made is a sale (its order paid by it, in SQL; the buyer's view
    of the order without it) for the order's sum, or a refund owed (in the refunds list) of the
    sum charged; a charge the callback never accepted is neither; and the list owes nothing the
    crowd did not cause."""
    name = "every charge accounted for"
    if end.refunds is None:
        return Check(name, False, "the refunds route did not answer")
    charges, refused = [], []
    for c in log.charges.values():
        refund = c.outcome == OrderStatus.REFUND_REQUIRED
        if refund or c.outcome == OrderStatus.PAID:
            charges.append(Charge(c.payment_id, int(c.order_id), refund, c.reason, c.amount))
        else:
            refused.append(f"{c.payment_id}: charged {c.amount}, answered {c.outcome}")
    if end.sql is not None:
        paid_by = {
            o.order_id: o.payment_id
            for o in end.sql.orders.values()
            if o.status is OrderStatus.PAID
        }
    else:  # the API shows an order's status, not its payment: the crowd's sale for it
        sale_of = {c.order_id: c.payment_id for c in log.charges.values() if c.outcome == "paid"}
        paid_by = {
            int(order_id): sale_of.get(order_id)
            for order_id, view in end.seen.items()
            if view is not None and view["status"] == OrderStatus.PAID
        }
    refunds = {r["payment_id"]: int(r["order_id"]) for r in end.refunds}
    accounts = account(
        charges, paid_by=paid_by, refunds=refunds,
        order_sums={int(o.order_id): o.cost for o in log.orders.values()},
        refund_sums={r["payment_id"]: Money(r["amount_cents"], r["currency"]) for r in end.refunds},
    )  # fmt: skip
    accounts = dataclasses.replace(accounts, unaccounted=refused + accounts.unaccounted)
    owed = Counter(c.reason or "?" for c in charges if c.refund)
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(owed.items()))
    sums = (
        f"charged {_total(c for c in charges if not c.refund)} in sales, "
        f"{_total(c for c in charges if c.refund)} owed back ({reasons or 'nothing'})"
    )
    return Check(name, accounts.balanced, f"{accounts.summary()}; {sums}")


def _total(charges: Iterable[Charge]) -> str:
    """The charges' sum in each currency (minor units): "900900 USD, 1200 EUR", or "0"."""
    cents = Counter[str]()
    for charge in charges:
        if charge.amount is not None:
            cents[charge.amount.currency] += charge.amount.cents
    return ", ".join(str(Money(n, currency)) for currency, n in sorted(cents.items())) or "0"


def _released_units(orders: list[CrowdOrder], end: SaleEnd) -> Check:
    came_back = Counter[str]()
    for order in orders:
        if order.status in RELEASED_STATUSES:
            came_back[order.release_reason or "refund"] += order.quantity
    late = sum(o.quantity for o in orders if o.wave == 2 and o.status == OrderStatus.PAID)
    sides = _sides(end)
    ok = bool(sides) and all(s["held"] == 0 and _balanced(s) for s in sides.values())
    back = end.back_on_sale and end.back_on_sale.get("redis")
    if back is not None:
        ok = ok and back["held"] == 0 and back["available"] == back["total"] - back["sold"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(came_back.items())) or "none"
    redis = sides.get("Redis", {})
    detail = (
        f"{sum(came_back.values())} units came back ({reasons}); the late crowd paid for {late}; "
        f"{redis.get('available', '?')} on sale, {redis.get('held', '?')} still held"
    )
    return Check("released units resold or on sale", ok, detail)


def _redis_equals_sql(end: SaleEnd) -> Check:
    counters = end.counters
    ok = bool(counters.get("agree")) and counters.get("backlog") == 0
    sides = _sides(end)
    shown = "; ".join(
        f"{name} {s['available']}/{s['held']}/{s['sold']}" for name, s in sides.items()
    )
    return Check(
        "Redis == SQL",
        ok,
        f"available/held/sold: {shown}; {counters.get('backlog')} events not landed",
    )


def _server_audit(end: SaleEnd) -> Check:
    if end.server_checks is None:
        return Check("server audit", False, "the admin audit route did not answer")
    failed = [c for c in end.server_checks if not c["ok"]]
    if not failed:
        return Check("server audit", True, f"{len(end.server_checks)} checks pass")
    shown = "; ".join(f"{c['name']}: {c['detail']}" for c in failed[:_SHOWN])
    return Check("server audit", False, f"{len(failed)} failed: {shown}")
