"""The reconciler: per item, find drift between Redis and SQL (``drift``), report it, repair it.

Which side wins a repair, and why:

- an order Redis has and SQL lacks or trails (an event deleted or dead-lettered before it
  landed): **Redis** wins. Every event starts in Redis, and the hold is what the buyer and the
  payment provider were told. Its events are journaled again (replay_holds.lua); the persister
  lands them, and transitions SQL already made are no-ops.
- a refund owed Redis has and SQL lacks (its event lost before it landed): **Redis** wins; its
  `refund_required` event is journaled again from the payment's record (replay_refunds.lua).
- an order or a refund owed SQL has and Redis lacks or trails, a sale Redis lost, a stream
  behind SQL: **SQL** wins. SQL holds only events Redis emitted and the persister
  acknowledged; Redis lost them (an older AOF, a failover, a restart). The item is rebuilt from
  SQL (``recovery``).
- an order row that disagrees with its own journal (edited by hand): the **journal** wins; it is
  the append-only record the row summarises.
- an order row whose journal lacks its `reserved` event (a later event landed first, and the
  `reserved` was lost with a Redis that went back): the **row** fills the gap; it holds all the
  event said (buyer, units, times), and the event moves no stock on a row already past it.
- counters that disagree with their own orders: the **orders** win, in Redis (the holds) and in
  SQL (the order rows); the counters are only their sums.
- the item's total: **SQL** wins; items are created and changed there and warmed into Redis.
- holds past their deadline: released now, as the reaper would.
- dead letters, orders that went different ways (paid in one, released in the other), a
  payment id on two orders, a charge that is neither a sale nor a refund owed, and order
  rows deleted from SQL while their journal remains: not repaired; a person decides (a refund,
  a replay once the cause is fixed, the row restored from a backup). While a row is missing
  the SQL counters are not recounted either: the orders are incomplete, so they cannot win.

Every repair is journaled in the ``repairs`` table.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from seckill.domain.events import stream_position
from seckill.domain.holds import Hold
from seckill.domain.items import Stock
from seckill.domain.orders import moves_order
from seckill.domain.outcomes import InvalidRequest, Outcome
from seckill.engine.audit import redis_accounts
from seckill.engine.engine import RedisEngine
from seckill.engine.reads import ItemSnapshot, combined_stock
from seckill.services.items import warm_item
from seckill.services.reconcile.drift import (
    REDIS_LOST,
    Drift,
    Finding,
    cross_item_findings,
    dead_letter_findings,
    find_drift,
    fold,
    journal_gaps,
    money_findings,
    payment_ids,
    sql_accounts,
    sql_findings,
)
from seckill.services.reconcile.recovery import rebuilt, recover_item
from seckill.services.reconcile.transfers import transfer_findings
from seckill.store.ledger import Ledger
from seckill.store.records import ItemBook, RepairRecord

log = logging.getLogger(__name__)

_Journal = Callable[[Drift, str, str, str], Awaitable[None]]
# Items compared together: their snapshots sent at once, their books in one SQL snapshot. A
# batch's fixed cost (the snapshot, a statement per table, the pipelines) was a third of a pass
# over 1,000 idle items at 100 a batch (0.40 s of CPU a pass; 0.27 s at 500).
COMPARED_AT_ONCE = 500
# A grace for overdue holds that never ends: for the checks to which an overdue hold is the
# reaper's business, not a disagreement (the audit, archiving).
NEVER_OVERDUE_MS = 2**62
REPLAYED = frozenset({Drift.ORDER_MISSING_IN_SQL, Drift.ORDER_BEHIND_IN_SQL})


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemReport:
    """One item's comparison: as of which stream position, what was found, what was repaired
    and what is left after the repairs (equal to ``found`` when nothing was repaired). The
    counters are the last look's: after the repairs, when any were made."""

    item_id: int
    position: str
    redis_stock: Stock | None
    sql_stock: Stock | None
    found: list[Finding]
    repairs: list[RepairRecord] = field(default_factory=list)
    left: list[Finding] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Comparison:
    """One look at an item: both sides as read, and what disagrees. Redis is read as one
    snapshot per stock shard (one for an unsharded item), shard 0 first."""

    snapshots: list[ItemSnapshot]
    book: ItemBook
    findings: list[Finding]

    @property
    def redis_stock(self) -> Stock | None:
        """The item's counters in Redis: across its shards, put on one cut (None: archived)."""
        if not self.snapshots:
            return None
        if len(self.snapshots) == 1 or any(s.item is None for s in self.snapshots):
            return self.snapshots[0].stock
        item = self.snapshots[0].item
        assert item is not None
        return combined_stock(
            item.total, [(s.stock, s.transfers) for s in self.snapshots if s.stock]
        )

    @property
    def holds(self) -> dict[int, Hold]:
        return {order_id: h for s in self.snapshots for order_id, h in s.holds.items()}


def _archived_findings(book: ItemBook, dead_letters: list[int]) -> list[Finding]:
    findings = sql_findings(book) + money_findings(sql_accounts(book), "SQL") + journal_gaps(book)
    if book.units_held:
        held = str(book.units_held)
        findings.append(Finding(Drift.SQL_COUNTERS, "held orders", "archived", held))
    for letters in dead_letters:
        findings += dead_letter_findings(letters)
    return findings


def _report(item_id: int, compared: Comparison) -> ItemReport:
    return ItemReport(
        item_id=item_id,
        position=compared.snapshots[0].last_event_id if compared.snapshots else "archived",
        redis_stock=compared.redis_stock,
        sql_stock=compared.book.stock,
        found=compared.findings,
        left=compared.findings,
    )


def _repaired(report: ItemReport, repairs: list[RepairRecord], after: Comparison) -> ItemReport:
    """``report`` with its repairs, and the counters and drift of the look taken after them."""
    return dataclasses.replace(
        report, repairs=repairs, left=after.findings,
        redis_stock=after.redis_stock, sql_stock=after.book.stock,
    )  # fmt: skip


class Reconciler:
    def __init__(self, engine: RedisEngine, ledger: Ledger, *, grace_ms: int) -> None:
        self._engine = engine
        self._ledger = ledger
        self._grace_ms = grace_ms

    async def item_ids(self) -> list[int]:
        """Items to look at: every item Redis has loaded and every sale SQL has not seen end
        (so a sale Redis lost entirely is still looked at)."""
        loaded = set(await self._engine.item_ids())
        return sorted(loaded | set(await self._ledger.unfinished_item_ids()))

    async def refunds_owed(self) -> int:
        """Refunds owed and not marked refunded yet, over every item (archived ones too)."""
        return (await self._ledger.payments.owed_in_all()).count

    async def compare(self, item_id: int) -> Comparison:
        """Compare one item now (see ``compare_many``)."""
        return (await self.compare_many([item_id]))[item_id]

    async def compare_many(self, item_ids: Sequence[int]) -> dict[int, Comparison]:
        """Compare items now: every Redis snapshot first, then the SQL books, then the streams'
        positions (the order ``drift`` needs), each step one round trip or statement per kind
        for all of them. With stock shards, each shard is compared with the part of the book
        its stream wrote; the SQL inventory, the item's, once against all of its orders."""
        counts = {item_id: await self._engine.shard_count(item_id) for item_id in item_ids}
        shards = [(item_id, shard) for item_id in item_ids for shard in range(counts[item_id])]
        snapshots = await self._engine.snapshots(shards)
        books = await self._ledger.books(item_ids)
        charged_on = await self._ledger.payments.charged_on(
            {p for book in books.values() for p in payment_ids(book)}
        )
        positions = await self._engine.last_event_ids(shards)
        dead = await self._ledger.dead_letter_counts(
            [self._engine.keys(item_id, shard).events for item_id, shard in shards]
        )
        by_item: dict[int, list[tuple[ItemSnapshot, str]]] = {item_id: [] for item_id in item_ids}
        for snapshot, position in zip(snapshots, positions, strict=True):
            by_item[snapshot.item_id].append((snapshot, position))
        return {
            item_id: self._compared(
                item_id, counts[item_id], by_item[item_id], books[item_id], dead, charged_on
            )
            for item_id in item_ids
        }

    def _compared(
        self,
        item_id: int,
        shards: int,
        read: list[tuple[ItemSnapshot, str]],
        book: ItemBook,
        dead: dict[str, int],
        charged_on: Mapping[str, set[tuple[int, int]]],
    ) -> Comparison:
        letters = [dead[self._engine.keys(item_id, shard).events] for shard in range(shards)]
        on_two_items = cross_item_findings(item_id, book, charged_on)
        if book.archived:  # SQL is its whole record: checked against itself alone
            return Comparison([], book, _archived_findings(book, letters) + on_two_items)
        findings: list[Finding] = []
        for snapshot, position in read:
            shard = snapshot.shard
            found = find_drift(
                snapshot,
                book if shards == 1 else book.for_shard(shard, shards),
                redis_position_now=position,
                dead_letters=letters[shard],
                grace_ms=self._grace_ms,
            )
            findings += [dataclasses.replace(f, shard=shard) for f in found]
        snapshots = [snapshot for snapshot, _ in read]
        if shards > 1:
            findings += sql_findings(book)
            findings += transfer_findings(snapshots)
        # A payment id is the item's, whatever the shards: each side's charges, over them all.
        findings += money_findings(redis_accounts(snapshots), "Redis")
        findings += money_findings(sql_accounts(book), "SQL")
        return Comparison(snapshots, book, findings + on_two_items)

    async def reconcile_many(
        self, item_ids: Sequence[int], *, repair: bool = False
    ) -> list[ItemReport]:
        """``reconcile`` of many items, compared ``COMPARED_AT_ONCE`` at a time."""
        reports = []
        for at in range(0, len(item_ids), COMPARED_AT_ONCE):
            batch = item_ids[at : at + COMPARED_AT_ONCE]
            compared = await self.compare_many(batch)
            for item_id in batch:
                reports.append(await self._reconciled(item_id, compared[item_id], repair=repair))
        return reports

    async def verify_fenced(self, item_ids: Sequence[int]) -> list[ItemReport]:
        """Check every fenced item of ``item_ids`` against SQL (see live_run in _common.lua):
        with nothing lost, each fenced shard is verified and sells again; with writes lost
        (``REDIS_LOST`` drift), the item is rebuilt from SQL, which lifts its fences too. A
        rebuild SQL refuses (more held and paid than the total) leaves it fenced, reported,
        for a person (``seckill recover``). Returns a report per fenced item."""
        reports = []
        for item_id in await self._engine.fenced_items(item_ids):
            compared = await self.compare(item_id)
            lost = [f for f in compared.findings if f.kind in REDIS_LOST]
            report = _report(item_id, compared)
            if lost:
                try:
                    repairs = await self._repair(item_id, lost, compared.book)
                except InvalidRequest as refused:
                    log.error("item %d stays fenced: rebuilding it from SQL was refused: %s",
                              item_id, refused)  # fmt: skip
                    await self._engine.flag_fenced([item_id])  # looked at again next time
                    reports.append(report)
                    continue
                report = dataclasses.replace(report, repairs=repairs, left=[])
            else:
                for snapshot in compared.snapshots:
                    if snapshot.fenced:
                        verified = await self._engine.verify(
                            item_id, snapshot.shard, seen_run=snapshot.run
                        )
                        if verified is Outcome.MOVED:  # fenced again meanwhile
                            await self._engine.flag_fenced([item_id])
                log.info("item %d verified against SQL after its Redis restarted: it sells",
                         item_id)  # fmt: skip
            reports.append(report)
        return reports

    async def reconcile(self, item_id: int, *, repair: bool = False) -> ItemReport:
        return await self._reconciled(item_id, await self.compare(item_id), repair=repair)

    async def look(self, item_id: int) -> ItemReport:
        """What disagrees, and nothing else done: no fence, no repair (for an operator's look;
        the reconciler's pass fences an item found behind SQL)."""
        return _report(item_id, await self.compare(item_id))

    async def _reconciled(self, item_id: int, compared: Comparison, *, repair: bool) -> ItemReport:
        found = compared.findings
        report = _report(item_id, compared)
        lost = {f.kind for f in found} & REDIS_LOST
        if not repair and lost:
            # Found behind SQL: it stops selling now, and the fence check rebuilds it (an item
            # Redis lost whole sells nothing as it is: rebuilt here, with nothing to merge).
            if Drift.REDIS_LOST_ITEM in lost:
                repairs = await self._repair(item_id, found, compared.book)
                return _repaired(report, repairs, await self.compare(item_id))
            for shard in range(await self._engine.shard_count(item_id)):
                await self._engine.fence(item_id, shard, "redis_lost")
        if not repair or not found:
            return report
        repairs = await self._repair(item_id, found, compared.book)
        repaired = _repaired(report, repairs, await self.compare(item_id))
        for finding in repaired.left:
            log.warning("item %d: drift left after repair: %s %s", item_id, finding.kind, finding)
        return repaired

    async def _repair(
        self, item_id: int, found: list[Finding], book: ItemBook
    ) -> list[RepairRecord]:
        kinds = {f.kind for f in found}
        done: list[RepairRecord] = []

        async def journal(kind: Drift, subject: str, action: str, detail: str) -> None:
            record = RepairRecord(
                item_id=item_id, kind=kind, subject=subject, action=action, detail=detail
            )
            await self._ledger.record_repair(record)
            log.warning("item %d: repaired %s (%s): %s; %s", item_id, kind, subject, action, detail)
            done.append(record)

        if kinds & REDIS_LOST:
            # Fenced first, so nothing sells on what Redis lost while it is rebuilt. Rebuilding
            # from SQL also recounts, keeps what Redis has beyond SQL and lifts the fences;
            # whatever else is wrong shows again on the next look, against the rebuilt state.
            # The rebuild journals itself (``recovery``), as an operator's does.
            for shard in range(await self._engine.shard_count(item_id)):
                await self._engine.fence(item_id, shard, "redis_lost")
            lost = sorted(kinds & REDIS_LOST)
            recovery = await recover_item(self._engine, self._ledger, item_id, found=lost)
            return [rebuilt(item_id, lost, recovery)]

        for finding in found:
            if finding.kind is Drift.SQL_ORDER_EDITED and finding.order_id is not None:
                await self._rewrite_order(item_id, finding, book, journal)
        replay = [
            (f.order_id, row.status if (row := book.orders.get(f.order_id)) else None)
            for f in found
            if f.kind in REPLAYED and f.order_id is not None
        ]
        if replay:
            replayed = await self._engine.replay_holds(item_id, replay)  # each on its shard
            by_order = {f.order_id: f for f in found if f.kind in REPLAYED}
            for order_id in replayed:
                finding = by_order[order_id]
                await journal(
                    finding.kind,
                    finding.subject,
                    "journaled its events again (Redis wins: every event starts there)",
                    f"Redis {finding.redis}; SQL {finding.sql}",
                )
        gaps = sorted(f.order_id for f in found if f.kind is Drift.JOURNAL_GAP and f.order_id)
        if gaps:
            filled = await self._ledger.journal_reservations(item_id, gaps)
            await journal(
                Drift.JOURNAL_GAP,
                f"{len(filled)} orders",
                "journaled each `reserved` again from its order row (the row wins)",
                ", ".join(map(str, filled[:20])),
            )
        for shard in sorted({f.shard for f in found if f.kind is Drift.REFUND_MISSING_IN_SQL}):
            owed = [
                f.payment_id
                for f in found
                if f.kind is Drift.REFUND_MISSING_IN_SQL and f.shard == shard and f.payment_id
            ]
            for payment_id in await self._engine.replay_refunds(item_id, shard, owed):
                await journal(
                    Drift.REFUND_MISSING_IN_SQL,
                    f"payment {payment_id}",
                    "journaled the refund owed again (Redis wins: every event starts there)",
                    f"shard {shard}",
                )
        for shard in sorted({f.shard for f in found if f.kind is Drift.REDIS_COUNTERS}):
            stock = await self._engine.recount(item_id, shard)
            await journal(
                Drift.REDIS_COUNTERS,
                "counters" if shard == 0 else f"counters of shard {shard}",
                "recounted from the holds (the holds win)",
                f"now {stock}",
            )
        if kinds & {Drift.SQL_COUNTERS, Drift.SQL_ORDER_EDITED} and (
            Drift.SQL_ORDER_DELETED not in kinds
        ):
            moved = await self._ledger.recount_inventory(item_id)
            if moved is not None and moved[0] != moved[1]:
                await journal(
                    Drift.SQL_COUNTERS,
                    "inventory",
                    "recounted from the orders (the orders win)",
                    f"was {moved[0]}, now {moved[1]}",
                )
        if Drift.TOTAL_DIFFERS in kinds:
            outcome = await warm_item(self._engine, self._ledger, item_id, force=True)
            await journal(
                Drift.TOTAL_DIFFERS, "total", "reloaded the item from SQL (SQL wins)", outcome
            )
        if Drift.OVERDUE_HOLDS in kinds:
            released: list[int] = []
            for shard in sorted({f.shard for f in found if f.kind is Drift.OVERDUE_HOLDS}):
                while batch := await self._engine.expire_due(item_id, limit=500, shard=shard):
                    released += batch
            await journal(
                Drift.OVERDUE_HOLDS,
                f"{len(released)} holds",
                "released as expired",
                ", ".join(map(str, released[:20])),
            )
        return done

    async def _rewrite_order(
        self, item_id: int, finding: Finding, book: ItemBook, journal: _Journal
    ) -> None:
        assert finding.order_id is not None
        row = book.orders[finding.order_id]
        events = [
            r for r in book.journal if r.order_id == row.order_id and moves_order(r.event, r.reason)
        ]
        status = fold([(stream_position(r.event_id), r.event) for r in events])
        quantity = next((r.quantity for r in events if r.quantity), row.quantity)
        hold = await self._engine.hold(item_id, row.order_id)
        buyer = hold.buyer if hold is not None else row.buyer
        if status is None:  # a row with no journal at all: nothing to rebuild it from
            return
        if await self._ledger.rewrite_order(
            row.order_id, status=status, quantity=quantity, buyer=buyer, expected=row
        ):
            await journal(
                Drift.SQL_ORDER_EDITED,
                finding.subject,
                "rewrote the row from its journal (the journal wins)",
                f"was {row.status}: {row.quantity} x {row.buyer}; "
                f"now {status}: {quantity} x {buyer}",
            )
