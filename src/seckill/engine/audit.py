"""The invariants (README "Invariants"), checked against one item's Redis state.

One place for these rules: the demo's verdict, the tests and the reconciler all ask here. The
state is one atomic snapshot, so a running sale is audited as exactly as a quiet one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from seckill.domain.holds import Hold, HoldState
from seckill.engine.engine import ItemSnapshot, RedisEngine


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def expected_journal(holds: Iterable[Hold]) -> Counter[str]:
    """The order events a complete journal holds for these holds, by kind."""
    kinds = Counter[str]()
    for hold in holds:
        kinds["reserved"] += 1
        if hold.state is not HoldState.HELD:
            kinds[hold.state.value] += 1  # paid, or released
        if hold.refund_required:
            kinds["refund_required"] += 1
    return kinds


def journal_check(where: str, found: Counter[str], holds: Iterable[Hold]) -> Check:
    expected = expected_journal(holds)
    kinds = ("reserved", "paid", "released", "refund_required")
    return Check(
        f"{where} journal complete",
        all(found[k] == expected[k] for k in kinds),
        "events " + ", ".join(f"{k} {found[k]}/{expected[k]}" for k in kinds) + " (found/holds)",
    )


async def audit_item(engine: RedisEngine, item_id: int, *, journal: bool = True) -> list[Check]:
    """Every invariant of one item in Redis, from one atomic snapshot. ``journal=False`` skips
    the stream's completeness: true only of a stream nobody trims; once a persister has landed
    and trimmed it, the journal lives in SQL and the reconciler checks it there."""
    return audit_snapshot(await engine.snapshot(item_id), journal=journal)


def audit_snapshot(snapshot: ItemSnapshot, *, journal: bool = True) -> list[Check]:
    item, stock = snapshot.item, snapshot.stock
    if item is None or stock is None:
        return [Check("item loaded", False, f"item {snapshot.item_id} is not in Redis")]
    holds = snapshot.holds
    units = Counter[HoldState]()
    per_buyer = Counter[str]()
    for hold in holds.values():
        units[hold.state] += hold.quantity
        if hold.state is not HoldState.RELEASED:
            per_buyer[hold.buyer] += hold.quantity
    over_limit = {b: n for b, n in per_buyer.items() if n > item.per_buyer_limit}
    held_ids = {h.order_id for h in holds.values() if h.state is HoldState.HELD}
    kinds = Counter(fields["event"] for _, fields in snapshot.events)
    reserved_ids = [f["order_id"] for _, f in snapshot.events if f["event"] == "reserved"]

    checks = [
        Check(
            "stock balanced",
            stock.balanced,
            f"available {stock.available} + held {stock.held} + sold {stock.sold}"
            f" = {stock.available + stock.held + stock.sold}, total {stock.total}",
        ),
        Check(
            "holds match counters",
            units[HoldState.HELD] == stock.held and units[HoldState.PAID] == stock.sold,
            f"held holds {units[HoldState.HELD]} vs held {stock.held}; "
            f"paid holds {units[HoldState.PAID]} vs sold {stock.sold}",
        ),
        Check(
            "buyers within limit",
            not over_limit and dict(per_buyer) == snapshot.buyers,
            f"{len(over_limit)} over the limit of {item.per_buyer_limit}"
            + ("" if dict(per_buyer) == snapshot.buyers else "; buyer counts disagree with holds"),
        ),
        Check(
            "deadlines index holds",
            set(snapshot.deadlines) == held_ids,
            f"{len(snapshot.deadlines)} indexed, {len(held_ids)} held",
        ),
    ]
    if journal:
        checks.append(journal_check("stream", Counter(kinds), holds.values()))
        checks.append(
            Check(
                "one reservation per hold",
                len(reserved_ids) == len(set(reserved_ids)),
                f"{len(reserved_ids)} reserved events for {len(set(reserved_ids))} orders",
            )
        )
    return checks
