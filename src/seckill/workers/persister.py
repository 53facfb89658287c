"""The persister: lands every item stream's events in SQL through the ledger.

One consumer group (``seckill.engine.streams.GROUP``) on every item stream, read through
``seckill.workers.consumer`` (discovery, one read per pass over every stream, claiming a dead
consumer's entries, starting again from its own pending entries after Redis failed, trimming,
reading ahead through a backlog, delivery counts and dead letters). Each batch lands in one
transaction, then is XACKed, so an entry is acknowledged only once it is in SQL. Through a
backlog the next batch is read and decoded meanwhile, and its landing begins (``_prepare``):
its own transaction locks its orders, plans and writes its rows, then waits for its turn
(``_turn``): the batch before it in SQL, so each item's counters move in stream order. A batch
naming an order of the one before it begins only once that one has landed. Several persister
processes share the group safely: the ledger makes every event idempotent and
order-independent.

Failures, by kind:
- the database is unreachable: the batch is retried as it is (no delivery counted) until it
  lands or the worker is stopped; nothing is read meanwhile (a batch read ahead is read again
  from Redis once it is back), so the backlog waits in Redis;
  before each try the batch keeps only the entries their streams still have (Redis may have
  lost writes meanwhile: those are not landed);
- another persister's transaction took a key this batch was about to write (the row of a new
  order whose events two batches carry): the batch is retried as it is, at once, and finds the
  other's rows; a key still refused after ``race_retries`` tries blames the entries, as below;
- an entry lands ahead of an earlier one still pending (a unit resold before its release
  landed): it waits, pending, and is claimed again with the earlier one, which lands first;
  with no earlier one pending, Redis sold a unit SQL counts sold already: Redis is behind SQL,
  and the item's shard is fenced (it sells nothing until the reconciler has rebuilt it) before
  the entry is blamed as below;
- an entry cannot land (undecodable, contradicting the record): the batch is split in halves
  until the bad entry stands alone, its neighbours land, and it stays pending; it comes back
  through XAUTOCLAIM once idle, and after ``max_deliveries`` it becomes a dead letter (a table
  row and an entry on the item's dead-letter stream) with its error;
- a crashed persister: its pending entries go idle and another persister claims them;
- Redis failed: the next read starts with this consumer's own pending entries (they land
  again, idempotently).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from seckill.domain.events import AheadOfStream, BadEvent, EventKind, StockEvent, decode_event
from seckill.engine.cluster import RedisClient
from seckill.engine.engine import RedisEngine
from seckill.engine.group_reader import Entry
from seckill.engine.streams import GROUP
from seckill.observability import metrics
from seckill.store.database import is_race, is_transient
from seckill.store.ledger import Ledger
from seckill.workers.consumer import BACKLOG_PASS_S, ConsumerConfig, StreamConsumer

log = logging.getLogger(__name__)

_COMMITS = metrics.SQL_TRANSACTIONS.labels(result="commit")
_FAILURES = metrics.SQL_TRANSACTIONS.labels(result="failure")
_RACES = metrics.SQL_TRANSACTIONS.labels(result="race")


@dataclass(frozen=True, slots=True, kw_only=True)
class PersisterConfig(ConsumerConfig):
    """How the persister reads, retries (``ConsumerConfig``: the database is its sink) and
    lands."""

    # After a part-full batch, wait this long before reading again, so that under load the next
    # batch gathers more: fewer, larger transactions (each costs a commit), an order lands at
    # most this much later.
    linger_ms: int = 20
    race_retries: int = 5  # tries of a batch a unique key refused, before it is blamed
    # A batch that takes longer is treated as an outage (a silent network drop would otherwise
    # hang the persister until TCP gives up, minutes later).
    apply_timeout_s: float = 30.0


class Persister:
    name = "persister"

    def __init__(
        self,
        *,
        redis: RedisClient,
        ledger: Ledger,
        prefix: str,
        consumer: str | None = None,
        config: PersisterConfig | None = None,
        stop: asyncio.Event | None = None,
        engine: RedisEngine | None = None,
    ) -> None:
        self._ledger = ledger
        self._engine = engine  # to fence a shard found behind SQL
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.config = config or PersisterConfig()
        self._consumer = StreamConsumer(
            redis=redis, group=GROUP, consumer=self.consumer, prefix=prefix, config=self.config,
            stop=stop or asyncio.Event(), dead_letters=metrics.DEAD_LETTERS,
            keep_letter=self._keep_letter,
        )  # fmt: skip
        self._reader = self._consumer.reader
        self.landed = 0
        self.races = 0  # batches retried after another persister took a key first

    @property
    def dead_lettered(self) -> int:
        """Entries this persister gave up on."""
        return self._consumer.dead_lettered

    async def run_once(self) -> int:
        """Claim idle entries, read new ones, land them; returns the entries acknowledged."""
        lots: list[_Lot] = []  # this pass's not landed yet, and the last one read
        try:
            return await self._consumer.run_pass(
                self._land, prepare=partial(self._prepare, lots),
                linger_s=self.config.linger_ms / 1000,
            )  # fmt: skip
        finally:
            await _drop_unlanded(lots)

    def _prepare(self, lots: list[_Lot], entries: list[Entry]) -> _Lot:
        """Each entry's event, and the lot's landing begun at once if the lot before it in the
        pass (landing meanwhile) names none of its orders: the ``Prepare`` of ``one_pass``."""
        lot = _decode(entries)
        before = lots[-1] if lots else None
        # Kept: the lots the pass may have to drop (not landed), and this one.
        lots[:] = [other for other in lots if not other.settled.done()]
        lots.append(lot)
        if (
            lot.events
            and before
            and self._ledger.plans_ahead
            and lot.orders.isdisjoint(before.orders)
        ):
            # Disjoint, the two transactions lock different orders: neither waits for the other
            # but on the item's counters, which this one moves only after its turn.
            events = [event for _, event in lot.events]
            lot.landing = asyncio.create_task(
                self._ledger.apply(events, turn=partial(_turn, before.settled))
            )
        return lot

    async def trim(self) -> None:
        """Drop stream entries every group has acknowledged (see ``GroupReader.trim``)."""
        await self._reader.trim()

    # -- landing -------------------------------------------------------------------------------

    async def _land(self, lot: _Lot) -> int:
        decoded = lot.events
        started = time.monotonic()
        try:
            landed = await self._land_begun(lot.landing, decoded) if lot.landing else None
            for entry, error in lot.undecodable:
                await self._consumer.failed(entry, error)
            if landed is None:
                landed = await self._apply(decoded)
        except BaseException:
            lot.settled.set_result(False)
            raise
        # In SQL: the lot after it may move the counters now, unless this one stalled (``_turn``).
        lot.settled.set_result(time.monotonic() - started <= BACKLOG_PASS_S)
        if not decoded:
            return 0
        await self._consumer.ack(landed)
        self.landed += len(landed)
        if landed:
            metrics.PERSISTER_BATCH_SIZE.observe(len(landed))
            metrics.PERSISTER_ROWS.inc(len(landed))
        _log_new_orders(decoded, landed)
        return len(landed)

    async def _land_begun(
        self, landing: asyncio.Task[int], batch: Sequence[tuple[Entry, StockEvent]]
    ) -> list[Entry] | None:
        """The landing begun ahead, finished; returns its entries, or None if it did not land
        (``_apply`` then tries it afresh, with every rule of failure)."""
        try:
            async with asyncio.timeout(self.config.apply_timeout_s):
                await landing
        except Exception as exc:  # a key another persister took, the database gone, ...
            if is_race(exc):
                self.races += 1
            (_RACES if is_race(exc) else _FAILURES).inc()
            log.info("a batch begun ahead did not land (%s); landing it afresh", exc)
            return None
        _COMMITS.inc()
        return [entry for entry, _ in batch]

    async def _apply(self, batch: Sequence[tuple[Entry, StockEvent]]) -> list[Entry]:
        """Land what can land; returns those entries. Splits around entries that cannot."""
        if not batch:
            return []
        backoff = self._consumer.backoff()
        races = 0
        while True:
            try:
                async with asyncio.timeout(self.config.apply_timeout_s):
                    await self._ledger.apply([event for _, event in batch])
                _COMMITS.inc()
                return [entry for entry, _ in batch]
            except Exception as exc:
                if is_race(exc) and races < self.config.race_retries:
                    races += 1
                    self.races += 1
                    _RACES.inc()
                    log.info("another persister landed part of this batch first; trying again")
                    continue
                _FAILURES.inc()
                if is_transient(exc):
                    if not await backoff.wait(f"the database unavailable ({exc})", len(batch)):
                        return []
                    batch = await self._still_in_redis(batch)
                    if not batch:
                        return []
                    continue
                if len(batch) == 1:
                    entry = batch[0][0]
                    if isinstance(exc, AheadOfStream):
                        if await self._reader.older_pending(entry):
                            # The release that freed this stock is pending elsewhere: once
                            # claimed it lands first, and this entry after it. Not its fault.
                            log.info("entry %s waits for earlier entries: %s", entry.entry_id, exc)
                            return []
                        await self._fence(entry, str(exc))
                    await self._consumer.failed(entry, f"{type(exc).__name__}: {exc}")
                    return []
                half = len(batch) // 2
                return await self._apply(batch[:half]) + await self._apply(batch[half:])

    async def _still_in_redis(
        self, batch: Sequence[tuple[Entry, StockEvent]]
    ) -> Sequence[tuple[Entry, StockEvent]]:
        """The entries of ``batch`` their streams still have. During an outage Redis may have
        lost some (a restart from an older AOF, a lagging replica promoted) and the reconciler
        found SQL agreeing without them: landing them late would record what Redis no longer
        holds (a unit it may have sold again)."""
        found = await self._reader.still_there([entry for entry, _ in batch])
        kept = [pair for pair, hit in zip(batch, found, strict=True) if hit]
        if len(kept) < len(batch):
            log.warning("%d entries read before the outage are gone from Redis (it lost writes): "
                        "not landed", len(batch) - len(kept))  # fmt: skip
        return kept

    async def _fence(self, entry: Entry, error: str) -> None:
        """Redis sold what SQL counts sold already: it lost writes. Its shard stops selling."""
        if self._engine is None:
            return
        keys = entry.keys
        await self._engine.fence(keys.item_id, keys.shard, "behind_sql")
        log.error("item %d shard %d fenced: Redis is behind SQL (%s)", keys.item_id, keys.shard,
                  error)  # fmt: skip

    async def _keep_letter(self, entry: Entry, *, error: str, deliveries: int) -> None:
        """A dead letter of the persister is a row in SQL too, where operators list, replay and
        drop them."""
        await self._ledger.add_dead_letter(
            stream=entry.keys.events,
            entry_id=entry.entry_id,
            payload=entry.fields,
            error=error,
            deliveries=deliveries,
        )


@dataclass(slots=True)
class _Lot:
    """A lot of entries as read: the events decoded, the entries that are none (with why), and
    where its landing stands."""

    events: list[tuple[Entry, StockEvent]] = field(default_factory=list)
    undecodable: list[tuple[Entry, str]] = field(default_factory=list)
    orders: set[int] = field(default_factory=set)  # the orders its events name
    # Its landing is over: True lets the lot after it write, False (it stalled) stops that one.
    settled: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # Its landing, begun while the lot before it landed (its transaction waits at ``_turn``).
    landing: asyncio.Task[int] | None = None


def _decode(entries: list[Entry]) -> _Lot:
    """Each entry's event."""
    lot = _Lot()
    for entry in entries:
        try:
            event = decode_event(entry.entry_id, entry.fields, shard=entry.keys.shard)
        except BadEvent as exc:
            lot.undecodable.append((entry, str(exc)))
            continue
        lot.events.append((entry, event))
        if event.order_id is not None:
            lot.orders.add(event.order_id)
    return lot


# A lot begun ahead waits at most this long for its turn: by then the pass has dropped it (the
# lot before stalled), and its transaction should not keep its rows locked.
TURN_WAIT_S = 2 * BACKLOG_PASS_S


class _Stalled(Exception):
    """The lot before stalled: the pass drops this one, read too long ago (Redis may have lost
    its entries since), so its transaction rolls back."""


async def _turn(before: asyncio.Future[bool]) -> None:
    """A lot begun ahead may move the counters once the lot before it has landed, and if that
    one did not stall. Its transaction has written its own rows by then."""
    async with asyncio.timeout(TURN_WAIT_S):
        if not await asyncio.shield(before):
            raise _Stalled


async def _drop_unlanded(lots: Sequence[_Lot]) -> None:
    """The lots of the pass not handled (read ahead of a lot that failed or stalled): their
    entries stay pending, read again by the next pass. A landing begun ahead ends by itself:
    refused at its turn when the lot before it did not land (each lot here is marked so), its
    transaction rolled back; or committed when that lot did land, and its entries then found
    landed when read again. It is cancelled, in the middle of whatever its database was doing,
    only if that database does not answer meanwhile."""
    unlanded = [lot for lot in lots if not lot.settled.done()]
    for lot in unlanded:
        lot.settled.set_result(False)
    landings = [lot.landing for lot in unlanded if lot.landing is not None]
    if not landings:
        return
    try:
        await asyncio.wait(landings, timeout=TURN_WAIT_S)
    finally:
        for landing in landings:
            landing.cancel()  # the hung ones; an ended landing ignores it
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await landing


# Orders named per landing line: a lot's line split so that no line outgrows what log shippers
# take whole (a container runtime splits lines past 16 kB).
ORDERS_PER_LINE = 100


def _log_new_orders(decoded: Sequence[tuple[Entry, StockEvent]], landed: list[Entry]) -> None:
    """The orders landed, each with the request id that reserved it: the end of its trace. A
    line per ``ORDERS_PER_LINE`` orders, ``order=request`` pairs: a JSON line per order cost the
    persister about 40 µs of CPU per order, a quarter of the rest of landing it in SQLite."""
    if not log.isEnabledFor(logging.INFO):
        return
    ids = {entry.entry_id for entry in landed}
    pairs = [
        f"{event.order_id}={event.request_id or '-'}"
        for entry, event in decoded
        if event.kind is EventKind.RESERVED and entry.entry_id in ids
    ]
    for start in range(0, len(pairs), ORDERS_PER_LINE):
        chunk = pairs[start : start + ORDERS_PER_LINE]
        log.info("orders landed in SQL (order=request): %s", " ".join(chunk))
