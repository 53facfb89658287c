"""The invariants of DESIGN.md, checked against one item's Redis state.

One place for these rules: the demo's verdict, the tests and (later) the reconciler all ask here.
Reads are several commands, so run it on a quiet item (no writes in between) for exact answers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from seckill.domain.holds import HoldState
from seckill.engine.engine import RedisEngine


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


async def audit_item(engine: RedisEngine, item_id: int) -> list[Check]:
    item = await engine.item(item_id)
    stock = await engine.stock(item_id)
    if item is None or stock is None:
        return [Check("item loaded", False, f"item {item_id} is not in Redis")]
    holds = await engine.holds(item_id)
    buyers = await engine.buyer_units(item_id)
    deadlines = await engine.deadlines(item_id)
    events = await engine.events(item_id)

    units = Counter[HoldState]()
    per_buyer = Counter[str]()
    for hold in holds.values():
        units[hold.state] += hold.quantity
        if hold.state is not HoldState.RELEASED:
            per_buyer[hold.buyer] += hold.quantity
    over_limit = {b: n for b, n in per_buyer.items() if n > item.per_buyer_limit}
    held_ids = {h.order_id for h in holds.values() if h.state is HoldState.HELD}
    kinds = Counter(fields["event"] for _, fields in events)
    reserved_ids = [fields["order_id"] for _, fields in events if fields["event"] == "reserved"]
    by_state = Counter(h.state for h in holds.values())

    return [
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
            not over_limit and dict(per_buyer) == buyers,
            f"{len(over_limit)} over the limit of {item.per_buyer_limit}"
            + ("" if dict(per_buyer) == buyers else "; buyer counts disagree with holds"),
        ),
        Check(
            "deadlines index holds",
            set(deadlines) == held_ids,
            f"{len(deadlines)} indexed, {len(held_ids)} held",
        ),
        Check(
            "journal complete",
            kinds["reserved"] == len(holds) == len(set(reserved_ids))
            and kinds["paid"] == by_state[HoldState.PAID]
            and kinds["released"] == by_state[HoldState.RELEASED],
            f"events reserved {kinds['reserved']} / paid {kinds['paid']} / released "
            f"{kinds['released']} vs holds {len(holds)} / {by_state[HoldState.PAID]} / "
            f"{by_state[HoldState.RELEASED]}",
        ),
    ]
