"""The invariants (docs/architecture.md, "Invariants"), checked against one item's Redis state.

One place for these rules: the demo's verdict, the tests and the reconciler all ask here. The
state is one atomic snapshot, so a running sale is audited as exactly as a quiet one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from seckill.domain.events import RefundReason
from seckill.domain.holds import Hold, HoldState
from seckill.domain.money import Accounts, Charge, Money, account
from seckill.domain.shards import home_shard
from seckill.engine.engine import RedisEngine
from seckill.engine.reads import ItemSnapshot, combined_stock


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def expected_journal(holds: Iterable[Hold], refunds: int) -> Counter[str]:
    """The order events a complete journal holds for these holds and ``refunds`` refunds owed
    (one event each), by kind."""
    kinds = Counter[str]()
    for hold in holds:
        kinds["reserved"] += 1
        if hold.state is not HoldState.HELD:
            kinds[hold.state.value] += 1  # paid, or released
    kinds["refund_required"] = refunds
    return kinds


def journal_check(where: str, found: Counter[str], holds: Iterable[Hold], refunds: int) -> Check:
    expected = expected_journal(holds, refunds)
    kinds = ("reserved", "paid", "released", "refund_required")
    return Check(
        f"{where} journal complete",
        all(found[k] == expected[k] for k in kinds),
        "events " + ", ".join(f"{k} {found[k]}/{expected[k]}" for k in kinds) + " (found/expected)",
    )


def charges(snapshots: Sequence[ItemSnapshot]) -> list[Charge]:
    """Every successful payment the shards recorded (a claim the head keeps for another shard
    is not one: that shard records the payment once it is settled)."""
    return [
        Charge(payment_id, int(record["order_id"]), record["outcome"] == "refund_required",
               record.get("reason"), recorded_charge(record))
        for snapshot in snapshots
        for payment_id, record in snapshot.payments.items()
        if record.get("succeeded") is True and "outcome" in record
    ]  # fmt: skip


def recorded_charge(record: dict[str, object]) -> Money | None:
    """The charge a payment record keeps (None: one given back from SQL, without it)."""
    if "amount" not in record:
        return None
    return Money(int(str(record["amount"])), str(record["currency"]))


def redis_accounts(snapshots: Sequence[ItemSnapshot]) -> Accounts:
    """An item's charges against its holds: a sale is a paid hold's own payment; a refund owed
    fits its hold (released and marked for refund; paid by another payment for a duplicate
    charge; any hold for a wrong sum; none for an unknown order)."""
    holds = {order_id: hold for s in snapshots for order_id, hold in s.holds.items()}
    found = charges(snapshots)
    paid_by = {o: h.payment_id for o, h in holds.items() if h.state is HoldState.PAID}
    refunds = {c.payment_id: c.order_id for c in found if c.refund and _fits(c, holds)}
    return account(found, paid_by=paid_by, refunds=refunds)


def _fits(refund: Charge, holds: dict[int, Hold]) -> bool:
    hold = holds.get(refund.order_id)
    if refund.reason == RefundReason.UNKNOWN_ORDER:
        return hold is None
    if hold is None:
        return False
    if refund.reason in (RefundReason.AMOUNT_MISMATCH, RefundReason.CURRENCY_MISMATCH):
        return True
    if refund.reason == RefundReason.DUPLICATE_CHARGE:
        return hold.state is HoldState.PAID and hold.payment_id != refund.payment_id
    return hold.state is HoldState.RELEASED and hold.refund_required


def money_check(accounts: Accounts, where: str = "") -> Check:
    return Check(f"{where}every charge accounted for", accounts.balanced, accounts.summary())


async def audit_item(engine: RedisEngine, item_id: int, *, journal: bool = True) -> list[Check]:
    """Every invariant of one item in Redis, from one atomic snapshot. ``journal=False`` skips
    the stream's completeness: true only of a stream nobody trims; once a persister has landed
    and trimmed it, the journal lives in SQL and the reconciler checks it there."""
    shards = await engine.shard_count(item_id)
    if shards == 1:
        return audit_snapshot(await engine.snapshot(item_id), journal=journal)
    return audit_shards([await engine.snapshot(item_id, s) for s in range(shards)], journal=journal)


def audit_shards(snapshots: Sequence[ItemSnapshot], *, journal: bool = True) -> list[Check]:
    """An item with stock shards: every shard as an item of its own (its counters balance
    against its own total), then the item across them: the shards put on one cut by their
    transfer records (``combined_stock``) balance against the item's total, every order lives on
    its buyer's home shard (so the per-buyer limit, checked per shard, holds for the item), and
    a transfer seen on both sides moved the same units."""
    checks = [
        replace(check, name=f"shard {snap.shard}: {check.name}")
        for snap in snapshots
        for check in audit_snapshot(snap, journal=journal, money=False)
    ]
    item = snapshots[0].item
    if item is None or any(snap.stock is None for snap in snapshots):
        return checks
    stock = combined_stock(item.total, [(s.stock, s.transfers) for s in snapshots if s.stock])
    misplaced = [
        order_id
        for snap in snapshots
        for order_id, hold in snap.holds.items()
        if home_shard(hold.buyer, len(snapshots)) != snap.shard
    ]
    sent = {n[4:]: r for s in snapshots for n, r in s.transfers.items() if n.startswith("out:")}
    received = {n[3:]: r for s in snapshots for n, r in s.transfers.items() if n.startswith("in:")}
    mismatched = [
        t for t in sent.keys() & received.keys() if sent[t]["units"] != received[t]["units"]
    ]
    return [
        *checks,
        Check(
            "item stock balanced across shards",
            stock.balanced,
            f"available {stock.available} + held {stock.held} + sold {stock.sold}"
            f" = {stock.available + stock.held + stock.sold}, total {stock.total}"
            f" over {len(snapshots)} shards",
        ),
        Check(
            "orders on their buyer's home shard",
            not misplaced,
            f"{len(misplaced)} elsewhere" + (f": {misplaced[:5]}" if misplaced else ""),
        ),
        Check(
            "transfers agree on both sides",
            not mismatched,
            f"{len(sent)} sent, {len(received)} received, {len(mismatched)} disagree",
        ),
        money_check(redis_accounts(snapshots)),
    ]


def audit_snapshot(
    snapshot: ItemSnapshot, *, journal: bool = True, money: bool = True
) -> list[Check]:
    """One item's (or one shard's) invariants. ``money=False`` leaves the charges to the caller
    (a sharded item's are checked across its shards: a payment id is the item's)."""
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
    if money:
        checks.append(money_check(redis_accounts([snapshot])))
    if journal:
        refunds = sum(c.refund for c in charges([snapshot]))
        checks.append(journal_check("stream", Counter(kinds), holds.values(), refunds))
        checks.append(
            Check(
                "one reservation per hold",
                len(reserved_ids) == len(set(reserved_ids)),
                f"{len(reserved_ids)} reserved events for {len(set(reserved_ids))} orders",
            )
        )
    return checks
