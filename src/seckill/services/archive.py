"""Archiving: a settled item leaves Redis; SQL keeps its record and answers for it.

The steps, and why a crash (kill -9) between any two leaves the item live or archived, never
half removed:

1. Settled? (reads only): the sale ended a grace period ago; on every shard no unit held and
   no transfer in transit; every consumer group of every stream has acknowledged every entry;
   no dead letter waiting for a replay; the reconciler finds no drift.
2. **The commit point**, one SQL transaction (``Ledger.mark_archived``): the payment notices
   Redis recorded are kept in SQL, and the item is marked archived. Before it the item is live
   and whole; from it on, every read answers from SQL (the item card, a buyer's order, a late
   payment notice, the reconciler, the audit) and warming or recovering it is refused.
3. Each shard's keys are deleted at once by ``archive.lua``, which checks again that nothing
   moved since its notices were copied (a late payment notice answered by Redis meanwhile is
   copied too, and its event landed, before the shard goes).
4. The item leaves the registries (workers stop walking it) and its buyers' idempotency
   records and rate windows, which would expire anyway, are swept.

A crash after 2 leaves keys nothing reads any more (the sale is over, nothing is held); the
next archiving of the item (the archiver's next pass, or by hand) finishes 3 and 4. One process
archives an item at a time: the item's upkeep lease.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from seckill.domain.items import ItemRecord
from seckill.domain.lifecycle import Hindrance, Stage, Unsettled, stage
from seckill.domain.money import Money
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import upkeep_lock_key
from seckill.engine.leases import Lease
from seckill.engine.reads import ShardRemains
from seckill.engine.streams import GROUP, read_progress
from seckill.services.items import UnknownItem
from seckill.services.paging import DEFAULT_PAGE, page_size
from seckill.services.reconcile.drift import Drift
from seckill.services.reconcile.reconciler import NEVER_OVERDUE_MS, Reconciler
from seckill.store.ledger import Ledger
from seckill.store.records import PaymentRecord

# One item's archiving is a few reads, one transaction and one script a shard: well under this.
# A holder killed mid-way delays the item by this much; two at once would only repeat steps
# that are each idempotent.
LEASE_TTL_MS = 10_000
MOVED_RETRIES = 3  # a shard that changed while being removed is read and tried again this often


@dataclass(frozen=True, slots=True)
class Settlement:
    """An item's stage, and what keeps it from being archived now (nothing: it may be)."""

    item_id: int
    stage: Stage
    hindrances: list[Hindrance] = field(default_factory=list)
    archived_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Archiving:
    """What one archiving did: ``stage`` is ``archived`` once SQL marks it so, and ``removed``
    once Redis holds none of its keys; ``hindrances`` say why not (nothing changed when the
    stage is not ``archived``)."""

    item_id: int
    stage: Stage
    removed: bool
    hindrances: list[Hindrance] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StagePage:
    """A page of items with their stages, newest first; ``next_cursor``: the id the next page
    starts below (None: this page is the last)."""

    stages: list[tuple[ItemRecord, Settlement]]
    next_cursor: int | None


def _may_be(wanted: Stage, record: ItemRecord, archived_at: datetime | None, now: datetime) -> bool:
    """Whether an item may be at ``wanted`` by its window alone (no read of Redis)."""
    by_window = stage(
        starts_at=record.starts_at, ends_at=record.ends_at, now=now,
        archived=archived_at is not None, hindrances=[],
    )  # fmt: skip
    if by_window is Stage.SETTLED:  # its sale is over: ended or settled, as Redis says
        return wanted in (Stage.ENDED, Stage.SETTLED)
    return by_window is wanted


class Archivist:
    """Tells each item's stage, and archives settled items."""

    def __init__(self, *, engine: RedisEngine, ledger: Ledger, grace: timedelta) -> None:
        self._engine = engine
        self._ledger = ledger
        self._grace = grace
        self._reconciler = Reconciler(engine, ledger, grace_ms=NEVER_OVERDUE_MS)

    async def due(self) -> list[int]:
        """The items to archive now, if settled: those in the registry whose sale ended a grace
        period ago, and those archived in SQL whose keys Redis still holds (one SQL query)."""
        return await self._ledger.archive_candidates(
            await self._engine.item_ids(), ended_before=datetime.now(UTC) - self._grace
        )

    async def settlement(
        self,
        item_id: int,
        *,
        record: ItemRecord | None = None,
        archived_at: datetime | None = None,
        now: datetime | None = None,
    ) -> Settlement:
        """The item's stage and what keeps it from being archived (UnknownItem if SQL has no
        such item). ``record`` and ``archived_at``: as already read, to spare a query."""
        if record is None:
            record = await self._ledger.item(item_id)
            if record is None:
                raise UnknownItem(f"no item {item_id}")
            archived_at = await self._ledger.archived_at(item_id)
        now = now or datetime.now(UTC)
        hindrances = [] if archived_at else await self._hindrances(record, now)
        return Settlement(
            item_id,
            stage(
                starts_at=record.starts_at, ends_at=record.ends_at, now=now,
                archived=archived_at is not None, hindrances=hindrances,
            ),
            hindrances,
            archived_at,
        )  # fmt: skip

    async def stages(self) -> list[tuple[ItemRecord, Settlement]]:
        """Every item SQL records, by id, with its stage."""
        now = datetime.now(UTC)
        return [
            (record, await self.settlement(record.item_id, record=record, archived_at=at, now=now))
            for record, at in await self._ledger.items()
        ]

    async def page(
        self, *, stage_of: Stage | None = None, before: int | None = None, limit: int = DEFAULT_PAGE
    ) -> StagePage:
        """One page of the items SQL records, newest first (by id), with their stages: those
        below ``before`` (the previous page's ``next_cursor``), at ``stage_of`` only if given.
        An ended item's stage takes reads of Redis; those of other stages take none."""
        limit = page_size(limit)
        now = datetime.now(UTC)
        archived = None if stage_of is None else stage_of is Stage.ARCHIVED
        found: list[tuple[ItemRecord, Settlement]] = []
        while len(found) <= limit:  # one more than the page: is there a next one?
            batch = await self._ledger.items_before(before, limit + 1, archived=archived)
            for record, at in batch:
                if stage_of is not None and not _may_be(stage_of, record, at, now):
                    continue
                settled = await self.settlement(
                    record.item_id, record=record, archived_at=at, now=now
                )
                if stage_of is None or settled.stage is stage_of:
                    found.append((record, settled))
                    if len(found) > limit:
                        break
            if len(batch) <= limit:
                break
            before = batch[-1][0].item_id
        more = len(found) > limit
        return StagePage(found[:limit], found[limit - 1][0].item_id if more else None)

    async def _hindrances(self, record: ItemRecord, now: datetime) -> list[Hindrance]:
        if now < record.ends_at:
            return [Hindrance(Unsettled.NOT_ENDED, f"the sale ends at {record.ends_at}")]
        found = []
        if now < record.ends_at + self._grace:
            archivable = record.ends_at + self._grace
            found.append(Hindrance(Unsettled.IN_GRACE, f"archivable from {archivable}"))
        item_id = record.item_id
        keys = [self._engine.keys(item_id, shard) for shard in range(record.stock_shards)]
        held = in_transit = 0
        for shard_keys in keys:
            part = await self._engine.shard_stock(item_id, shard_keys.shard)
            held += part[0].held if part else 0
            in_transit += int(await self._engine.redis.zcard(shard_keys.in_transit))
        if held:
            found.append(Hindrance(Unsettled.HELD, f"{held} units held"))
        if in_transit:  # delivered by the reaper within a pass or two
            found.append(Hindrance(Unsettled.HELD, f"{in_transit} stock transfers in transit"))
        for shard_keys, progress in zip(
            keys, await read_progress(self._engine.redis, [k.events for k in keys]), strict=True
        ):
            behind = {name: g.backlog for name, g in progress.groups.items() if g.backlog}
            if progress.length and not progress.groups:
                behind = {GROUP: progress.length}
            if behind:
                shown = ", ".join(f"{name} {n}" for name, n in sorted(behind.items()))
                found.append(Hindrance(Unsettled.BACKLOG, f"{shard_keys.events}: {shown}"))
        for shard_keys in keys:
            letters = await self._ledger.dead_letter_count(shard_keys.events)
            if letters:
                shown = f"{letters} pending: `seckill dead-letters replay --group {GROUP}`"
                found.append(Hindrance(Unsettled.DEAD_LETTERS, f"{shard_keys.events}: {shown}"))
            remains = await self._engine.shard_remains(item_id, shard_keys.shard)
            # The persister's are in SQL (above); a bridge's are only here: what it could not
            # deliver is lost with the stream, so a person decides first.
            groups = Counter(f.get("dead_group", GROUP) for _, f in remains.dead_letters)
            for group, letters in sorted(groups.items()):
                if group == GROUP:
                    continue
                command = f"seckill dead-letters replay --group {group}"
                shown = f"{letters} {group} gave up on: `{command}` (or `drop` them)"
                found.append(
                    Hindrance(Unsettled.DEAD_LETTERS, f"{shard_keys.dead_letters}: {shown}")
                )
        # Dead letters are told above, with what to do; a payment id another item used too is
        # between the two items' records, which archiving keeps whole (the reconciler reports it).
        drift = [
            f
            for f in (await self._reconciler.compare(item_id)).findings
            if f.kind not in (Drift.DEAD_LETTERS, Drift.PAYMENT_ON_TWO_ITEMS)
        ]
        if drift:
            shown = "; ".join(f"{f.kind} {f.subject}" for f in drift[:3])
            found.append(Hindrance(Unsettled.DRIFT, f"{len(drift)} findings: {shown}"))
        return found

    async def archive(self, item_id: int, *, waive_grace: bool = False) -> Archiving:
        """Archive the item if it is settled (see the module's steps); finish the removal of
        one already archived. ``waive_grace``: an operator's "now", without waiting out the
        grace period (the item must still be settled). UnknownItem if SQL has no such item."""
        record = await self._ledger.item(item_id)
        if record is None:
            raise UnknownItem(f"no item {item_id}")
        lease = Lease(
            self._engine.redis,
            scripts=self._engine.scripts,
            key=upkeep_lock_key(f"archive:{item_id}", self._engine.prefix),
            ttl_ms=LEASE_TTL_MS,
        )
        if not await lease.acquire():
            busy = Hindrance(Unsettled.MOVED, "another process is archiving it now")
            settlement = await self.settlement(item_id)
            return Archiving(item_id, settlement.stage, removed=False, hindrances=[busy])
        try:
            if await self._ledger.archived_at(item_id) is None:
                settlement = await self.settlement(item_id, record=record, archived_at=None)
                hindrances = [
                    h
                    for h in settlement.hindrances
                    if not (waive_grace and h.reason is Unsettled.IN_GRACE)
                ]
                if hindrances:
                    return Archiving(item_id, settlement.stage, False, hindrances)
                shards = range(record.stock_shards)
                remains = [await self._engine.shard_remains(item_id, s) for s in shards]
                await self._ledger.mark_archived(item_id, _payments(item_id, remains))
            left = await self._remove(item_id, record.stock_shards)
            return Archiving(item_id, Stage.ARCHIVED, removed=not left, hindrances=left)
        finally:
            await lease.drop()

    async def _remove(self, item_id: int, shards: int) -> list[Hindrance]:
        """Delete an archived item's keys, shard by shard, the item's head (shard 0) last; what
        stops a shard, if anything. The shard count is SQL's: once shard 0 is gone, Redis no
        longer says it."""
        for shard in reversed(range(shards)):
            for _ in range(MOVED_RETRIES):
                remains = await self._engine.shard_remains(item_id, shard)
                await self._ledger.payments.keep(item_id, _payments(item_id, [remains]))
                why = await self._engine.archive_shard(item_id, shard, remains)
                if why is not Unsettled.MOVED:
                    break
            if why is not None:
                keys = self._engine.keys(item_id, shard)
                return [Hindrance(why, f"{keys.item}: removed once it is settled again")]
        await self._engine.forget_item(item_id, shards)
        return []


def _payments(item_id: int, remains: list[ShardRemains]) -> list[PaymentRecord]:
    """The notices the shards answered. A claim the item's head keeps for another shard is
    not an answer (its shard has the answer, or its notice was never answered: its retry is
    settled in SQL)."""
    return [
        PaymentRecord(
            payment_id=payment_id,
            item_id=item_id,
            order_id=int(answer["order_id"]),
            succeeded=bool(answer["succeeded"]),
            outcome=str(answer["outcome"]),
            reason=answer.get("reason"),
            charged=Money(int(answer["amount"]), str(answer["currency"]))
            if "amount" in answer
            else None,
        )
        for part in remains
        for payment_id, answer in part.payments.items()
        if "outcome" in answer
    ]
