"""The bridge: forwards every item stream's order events to a broker, for the shop's other
systems, once SQL has them.

A consumer group of its own on every item stream (``bridge_group``: one per sink, beside the
persister's, each with its own progress), read through ``seckill.workers.consumer``. Each
pass publishes a batch through the sink (``seckill.sinks``) and acknowledges an entry **only
once the broker confirmed it**, so a crash or an outage never loses an event: it is published
again, with the same message id, and the consumer (or NATS itself) drops the copy.

An order event is published **only once SQL has landed it** (its row in the journal,
``stock_flow``): what seckill tells another system is never taken back, whatever Redis loses
later. Each pass asks SQL, in one query, which of the batch's order events have landed; on each
stream it publishes the events up to the first one that has not (so each order's events keep
their order), and leaves that one and the rest of its stream pending. The next read, after a
short pause (the persister lands within tens of milliseconds; the pause grows while nothing
lands), starts with this consumer's pending entries, from Redis: an entry Redis lost meanwhile
(an older AOF, a lagging replica promoted) is gone from them with its stream, and is never
published. The group is registered in SQL as well as in Redis (once per process), so a recovery
from SQL makes it again before it gives a stream its events back.

Failures, by kind:
- the broker is unreachable or does not confirm in time: the batch is published again after a
  growing pause (capped) until it is confirmed or the worker is stopped; nothing new is read
  meanwhile, so the backlog waits in the stream (buying and the SQL persister go on);
- SQL is unreachable, or the persister is behind or stopped: nothing is published, the entries
  wait, pending, and are read again after each pause (growing to ``landing_pause_max_s`` once
  nothing has landed for ``landing_patience_s``);
- the broker refuses messages (a nack): the others are acknowledged, the refused stay pending
  and are published again no sooner than ``claim_idle_ms`` later (claimed, or read again with
  this consumer's pending entries); after ``max_deliveries`` refusals an entry is a dead letter
  (an entry on the item's dead-letter stream naming the group, and a count), acknowledged;
- an event the persister set aside (its dead letter: not in SQL, and never unless a person
  replays it): it holds its stream until the persister gives up on it, then, once the bridge
  finds the persister's letter, it becomes a dead letter of the bridge too, naming the
  persister's, and the stream goes on; replayed, the bridge's letter is published only if the
  persister's was replayed first (it landed). One the persister's operator dropped is never
  published: acknowledged, with a log line;
- an entry that cannot be read as an event: a dead letter at once (the persister reports it
  too, in SQL);
- a crashed bridge: started again (its consumer is named after its host), it publishes what
  it had read and not seen confirmed before anything newer, so each order's events keep their
  order; a bridge that does not come back leaves them to go idle and be claimed by another.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from seckill.domain.dead_letters import DeadLetter
from seckill.domain.events import BadEvent, StockEvent, decode_event
from seckill.engine.cluster import RedisClient
from seckill.engine.group_reader import Entry
from seckill.observability import metrics
from seckill.sinks import (
    Message,
    Sink,
    SinkRefused,
    SinkUnavailable,
    bridge_group,
    order_message,
)
from seckill.store.database import is_transient
from seckill.store.landing import EventKey
from seckill.store.ledger import Ledger
from seckill.workers.consumer import ConsumerConfig, StreamConsumer, as_read

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeConfig(ConsumerConfig):
    """How the bridge reads and retries (``ConsumerConfig``: the broker is its sink)."""

    retry_pause_s: float = 0.2  # first pause while the broker is unreachable (doubles, capped)
    # Entries whose events SQL has not landed wait this long, pending, before they are read
    # again (the persister lands within tens of milliseconds). Once nothing has landed for
    # ``landing_patience_s`` (SQL down, the persister stopped) the pause doubles each time, up
    # to the maximum.
    landing_pause_s: float = 0.01
    landing_patience_s: float = 0.25
    landing_pause_max_s: float = 1.0
    landed_timeout_s: float = 5.0  # the query of what landed; longer counts as SQL down
    # A stream held this long by the same unlanded event is looked up among the persister's dead
    # letters (and again after as long each time).
    set_aside_check_s: float = 1.0


@dataclass(slots=True)
class _Refused:
    times: int
    again_at: float  # time.monotonic(): not published again before


class Bridge:
    name = "bridge"

    def __init__(
        self,
        *,
        redis: RedisClient,
        ledger: Ledger,
        sink: Sink,
        prefix: str,
        consumer: str | None = None,
        config: BridgeConfig | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self._ledger = ledger
        self._sink = sink
        # The host's name, the same after a restart: the bridge then starts with what it had
        # read and not seen confirmed (the reader's own pending entries), before anything
        # newer, so each order's events still reach the broker in their order.
        self.consumer = consumer or socket.gethostname()
        self.config = config or BridgeConfig()
        self._stop = stop or asyncio.Event()
        self.group = bridge_group(sink.name)
        self._consumer = StreamConsumer(
            redis=redis, group=self.group, consumer=self.consumer, prefix=prefix,
            config=self.config, stop=self._stop,
            dead_letters=metrics.BRIDGE_DEAD_LETTERS.labels(sink=sink.name),
        )  # fmt: skip
        self._reader = self._consumer.reader
        self._reader.redis_failed()  # its own pending entries first
        self._published = metrics.BRIDGE_PUBLISHED.labels(sink=sink.name)
        self._retries = metrics.BRIDGE_RETRIES.labels(sink=sink.name)
        self._registered = False
        self._landing_pause = self.config.landing_pause_s
        self._still_since = time.monotonic()  # when the bridge last moved anything on
        self._waiting = False  # the pass left entries pending until SQL has their events
        self._moved = False  # the pass acknowledged something
        # Per stream, the unlanded event holding it and when to look for it (and those after
        # it) among the persister's dead letters.
        self._held: dict[str, tuple[str, float]] = {}
        self._refused: dict[tuple[str, str], _Refused] = {}
        self.forwarded = 0
        self.never_landed = 0  # events the persister's operator dropped: never published

    @property
    def dead_lettered(self) -> int:
        """Entries this bridge gave up on."""
        return self._consumer.dead_lettered

    async def run_once(self) -> int:
        """Claim idle entries, read new ones, publish those SQL has; returns the entries
        confirmed."""
        await self._register()
        self._waiting = self._moved = False
        done = await self._consumer.run_pass(self._forward, prepare=as_read)
        now = time.monotonic()
        if self._moved or not self._waiting:
            self._still_since = now
            self._landing_pause = self.config.landing_pause_s
        if not self._waiting:
            return done
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self._landing_pause)
        if now - self._still_since >= self.config.landing_patience_s:
            self._landing_pause = min(self._landing_pause * 2, self.config.landing_pause_max_s)
        return done

    async def _register(self) -> None:
        """The group in SQL's registry, once per process: recovery makes it from there."""
        if self._registered:
            return
        try:
            await self._ledger.register_group(self.group)
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("%s: cannot register in SQL yet (%s)", self.group, exc)
            return
        self._registered = True

    async def _forward(self, entries: Sequence[Entry]) -> int:
        """Publish what SQL has, then acknowledge what the broker confirmed; returns how many."""
        if not entries:
            return 0
        read: list[tuple[Entry, StockEvent, Message | None]] = []
        for entry in entries:
            try:
                event = decode_event(entry.entry_id, entry.fields, shard=entry.keys.shard)
                message = order_message(event, stream=entry.keys.events)
            except BadEvent as exc:
                await self._consumer.dead_letter(entry, str(exc), deliveries=1)
                continue
            read.append((entry, event, message))
        landed = await self._landed([event for _, event, message in read if message])
        letters = {} if landed is None else await self._set_aside(read, landed)
        landed = landed or set()
        now = time.monotonic()
        sendable: list[tuple[Entry, Message]] = []
        done: list[Entry] = []  # item and stock events (not the shop's orders), orders dropped
        held: set[str] = set()  # streams waiting, pending, for SQL to land an event
        for entry, event, message in read:
            stream = entry.keys.events
            if stream in held:
                continue  # pending behind an earlier event of its stream
            if message is None:
                done.append(entry)
            elif (event.item_id, event.shard, event.event_id) in landed:
                if not self._refused or self._may_publish_again(entry, now):
                    sendable.append((entry, message))
                # else refused lately: pending, and the others go on as before
            elif not await self._never_lands(entry, letters.get((stream, entry.entry_id))):
                held.add(stream)
        confirmed = await self._publish(sendable)
        await self._consumer.ack(confirmed + done)
        if self._refused:
            for entry in confirmed:
                self._refused.pop((entry.keys.events, entry.entry_id), None)
        if held:
            self._waiting = True
            self._reader.read_pending_next()
        self._moved = self._moved or bool(confirmed or done)
        self.forwarded += len(confirmed)
        self._published.inc(len(confirmed))
        return len(confirmed)

    async def _landed(self, events: Sequence[StockEvent]) -> set[EventKey] | None:
        """Which of ``events`` SQL's journal holds; None while SQL cannot answer."""
        if not events:
            return set()
        try:
            async with asyncio.timeout(self.config.landed_timeout_s):
                return await self._ledger.landed_events(events)
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("the database cannot say what landed (%s): %d events wait, pending",
                        exc, len(events))  # fmt: skip
            return None

    async def _set_aside(
        self, read: Sequence[tuple[Entry, StockEvent, Message | None]], landed: set[EventKey]
    ) -> dict[tuple[str, str], DeadLetter]:
        """The persister's dead letters of the unlanded order events of each stream held by the
        same event for ``set_aside_check_s`` (looked up again after as long each time)."""
        now = time.monotonic()
        unlanded: dict[str, list[Entry]] = defaultdict(list)
        for entry, event, message in read:
            if message is not None and (event.item_id, event.shard, event.event_id) not in landed:
                unlanded[entry.keys.events].append(entry)
        for entry, _, _ in read:
            if entry.keys.events not in unlanded:
                self._held.pop(entry.keys.events, None)
        due: list[Entry] = []
        for stream, waiting in unlanded.items():
            head = waiting[0].entry_id
            known = self._held.get(stream)
            if known is not None and known[0] == head and now < known[1]:
                continue
            self._held[stream] = (head, now + self.config.set_aside_check_s)
            if known is not None and known[0] == head:
                due += waiting
        if not due:
            return {}
        try:
            return await self._ledger.dead_letters_of([(e.keys.events, e.entry_id) for e in due])
        except Exception as exc:
            if not is_transient(exc):
                raise
            return {}  # looked up again next time

    async def _never_lands(self, entry: Entry, letter: DeadLetter | None) -> bool:
        """Whether an event SQL lacks will never land unless a person acts: the persister set
        it aside. One dropped is acknowledged, never published; one still set aside becomes the
        bridge's dead letter too (acknowledged), so its stream goes on."""
        if letter is None or letter.replayed_at is not None:
            return False  # still the persister's to land (or landed since SQL was asked)
        if letter.dropped_at is not None:
            await self._consumer.ack([entry])
            self.never_landed += 1
            log.warning("entry %s of %s never landed (its dead letter %s was dropped): not "
                        "published", entry.entry_id, entry.keys.events, letter.id)  # fmt: skip
        else:
            error = (
                f"not in SQL: the persister set it aside as dead letter {letter.id} "
                f"({letter.error}); replay that one first, then this one"
            )
            await self._consumer.dead_letter(entry, error, deliveries=letter.deliveries)
        self._moved = True
        return True

    def _may_publish_again(self, entry: Entry, now: float) -> bool:
        refused = self._refused.get((entry.keys.events, entry.entry_id))
        return refused is None or now >= refused.again_at

    async def _publish(self, batch: Sequence[tuple[Entry, Message]]) -> list[Entry]:
        """The entries whose messages the broker confirmed, retrying while it is unreachable."""
        backoff = self._consumer.backoff()
        while batch:
            try:
                await self._sink.publish([message for _, message in batch])
                return [entry for entry, _ in batch]
            except SinkUnavailable as exc:
                self._retries.inc()
                if not await backoff.wait(f"{self._sink.name} unreachable ({exc})", len(batch)):
                    return []
            except SinkRefused as exc:
                self._retries.inc()
                refused = set(exc.message_ids)
                for entry, message in batch:
                    if message.message_id in refused:
                        await self._was_refused(entry, str(exc))
                return [entry for entry, message in batch if message.message_id not in refused]
        return []

    async def _was_refused(self, entry: Entry, error: str) -> None:
        """A message the broker refused: published again later, dead after the last refusal.
        Refusals are counted here, not by Redis's deliveries, which grow each time the entry
        is read again while its stream waits for SQL."""
        key = (entry.keys.events, entry.entry_id)
        refused = self._refused.setdefault(key, _Refused(0, 0.0))
        refused.times += 1
        refused.again_at = time.monotonic() + self.config.claim_idle_ms / 1000
        refusal = f"{self._sink.name} refused it: {error}"
        if await self._consumer.failed(entry, refusal, deliveries=refused.times):
            del self._refused[key]

    async def close(self) -> None:
        await self._sink.close()
