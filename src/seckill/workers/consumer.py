"""One consumer of the item streams, for every sink's worker: the persister lands entries in SQL,
a bridge publishes them to a broker, and each says only what an entry means to it.

What they share is written here once: the pass (``one_pass``: claim a dead consumer's entries,
read new ones, hand them to the sink, trim, read ahead through a backlog), the delivery counts
and dead letters of entries a sink cannot take (``StreamConsumer.failed``), and the pauses while
a sink is down (``Backoff``). The streams are read through ``seckill.engine.group_reader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from redis.exceptions import ResponseError

from seckill.engine.cluster import REDIS_UNAVAILABLE, RedisClient
from seckill.engine.dead_letters import add_dead_letter
from seckill.engine.group_reader import Entry, GroupReader, ReadConfig
from seckill.workers.loop import RETRY_PAUSE_MAX_S

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig(ReadConfig):
    """How a consumer of the streams (the persister, a bridge) reads and retries."""

    max_deliveries: int = 5  # an entry its sink refused this often is a dead letter
    retry_pause_s: float = 0.5  # the first pause while its sink is down (doubles, capped)
    retry_pause_max_s: float = RETRY_PAUSE_MAX_S


class Backoff:
    """The pauses between tries of a sink that is down: the first pause, doubling up to the cap.
    One per batch in hand: the next batch starts again from the first pause."""

    def __init__(self, config: ConsumerConfig, stop: asyncio.Event) -> None:
        self._pause = config.retry_pause_s
        self._cap = config.retry_pause_max_s
        self._stop = stop

    async def wait(self, down: str, pending: int) -> bool:
        """After a try that found the sink down (``down`` says how): pause, then True to try
        again; False at once if the worker is stopping, its ``pending`` entries left for the
        next consumer (or its own next start) to take."""
        if self._stop.is_set():
            log.warning("stopping with %s; %d entries stay pending", down, pending)
            return False
        log.warning("%s; trying again in %.1f s", down, self._pause)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self._pause)
        self._pause = min(self._pause * 2, self._cap)
        return True


class KeepLetter(Protocol):
    """Where else a sink keeps its dead letters (the persister: in SQL, before Redis)."""

    async def __call__(self, entry: Entry, *, error: str, deliveries: int) -> None: ...


class DeadLetterCount(Protocol):
    """A counter of dead letters (a prometheus counter, labelled or not)."""

    def inc(self, amount: float = 1) -> None: ...


class StreamConsumer:
    """One consumer of ``group`` on every item stream: its reader, its passes, and what becomes
    of entries its sink cannot take."""

    def __init__(
        self,
        *,
        redis: RedisClient,
        group: str,
        consumer: str,
        prefix: str,
        config: ConsumerConfig,
        stop: asyncio.Event,
        dead_letters: DeadLetterCount,
        keep_letter: KeepLetter | None = None,
    ) -> None:
        self._redis = redis
        self.group = group
        self.config = config
        self._stop = stop
        self._dead_letters = dead_letters
        self._keep_letter = keep_letter
        self.reader = GroupReader(
            redis=redis, group=group, consumer=consumer, prefix=prefix, config=config
        )
        self.dead_lettered = 0

    async def run_pass(
        self, handle: Handle[Lot], *, prepare: Prepare[Lot], linger_s: float = 0.0
    ) -> int:
        """One pass (``one_pass``); returns the entries done."""
        return await one_pass(self.reader, handle, prepare=prepare, linger_s=linger_s)

    def backoff(self) -> Backoff:
        """Fresh pauses for the batch in hand while its sink is down."""
        return Backoff(self.config, self._stop)

    async def ack(self, entries: Sequence[Entry]) -> None:
        """Done with these: the sink has them."""
        await self.reader.ack(entries)

    async def failed(self, entry: Entry, error: str, *, deliveries: int | None = None) -> bool:
        """An entry its sink could not take: left pending (claimed again once idle, or read
        again) until it failed ``max_deliveries`` times, then a dead letter; True if it became
        one. ``deliveries``: the sink's own count of its failures, where Redis's count of
        deliveries says something else (a bridge reads an entry again while SQL lacks its
        event); default, Redis's."""
        if deliveries is None:
            deliveries = await self.reader.deliveries(entry)
        if deliveries < self.config.max_deliveries:
            log.warning(
                "entry %s of %s failed in %s (%d of %d): %s", entry.entry_id, entry.keys.events,
                self.group, deliveries, self.config.max_deliveries, error,
            )  # fmt: skip
            return False
        await self.dead_letter(entry, error, deliveries=deliveries)
        return True

    async def dead_letter(self, entry: Entry, error: str, *, deliveries: int) -> None:
        """Give up on an entry: kept where the sink keeps its letters, then on the shard's
        dead-letter stream naming this group, then acknowledged, so its stream goes on."""
        if self._keep_letter is not None:
            await self._keep_letter(entry, error=error, deliveries=deliveries)
        await add_dead_letter(
            self._redis, entry.keys, entry_id=entry.entry_id, fields=entry.fields,
            group=self.group, error=error, deliveries=deliveries,
        )  # fmt: skip
        await self.reader.ack([entry])
        self.dead_lettered += 1
        self._dead_letters.inc()
        log.error("entry %s of %s is a dead letter of %s: %s", entry.entry_id,
                  entry.keys.events, self.group, error)  # fmt: skip


# -- the pass ----------------------------------------------------------------------------------

Lot = TypeVar("Lot")
Prepare = Callable[[list[Entry]], Lot]
"""What a consumer makes of entries as soon as they are read, before its sink is free (the
persister decodes them): work done while the lot before them is still with the sink."""
Handle = Callable[[Lot], Awaitable[int]]
"""What a consumer does with a prepared lot: hands it to its sink, acknowledges what the sink has
(and dead-letters what it never will), and returns how many entries it is done with."""


def as_read(entries: list[Entry]) -> list[Entry]:
    """The ``Prepare`` of a consumer that handles entries as they were read."""
    return entries


# How long one pass goes on handling a backlog lot after lot before its upkeep (claims,
# discovery, trims) is due again; a sink that took longer over one lot stalled (see one_pass).
BACKLOG_PASS_S = 1.0


async def one_pass(
    reader: GroupReader,
    handle: Handle[Lot],
    *,
    prepare: Prepare[Lot],
    linger_s: float = 0.0,
) -> int:
    """One pass of a worker that reads through ``reader`` (the persister, a bridge): claim a
    dead consumer's entries and handle them, read new ones and handle them, trim when due;
    returns the entries done. ``linger_s``: after a part-full read, wait this long so that under
    load the next lot gathers more.

    Through a backlog the pass reads ahead: while the sink takes one lot, the next is read and
    prepared, in the time the sink's server works, for up to ``BACKLOG_PASS_S``. A lot is
    handled only after the one before it, so a stream's entries still land in order. A lot read
    ahead while the sink stalled (an outage) is not handled: Redis may have lost entries since,
    so the next read takes this consumer's pending entries again from Redis.

    A lot that leaves entries pending on purpose (``GroupReader.read_pending_next``: a bridge
    whose events SQL has not landed yet) ends the pass: the lot read ahead is not handled, and
    the next read starts with the pending entries, so nothing newer of their streams goes first.

    When Redis fails under it, the next read starts with the consumer's own pending entries;
    when a stream lost its group (Redis restarted empty, FLUSHALL, an older AOF; ``seckill
    recover`` puts the items back), the streams are followed afresh (an archived item's among
    them)."""

    async def read(*, block: bool) -> tuple[int, Lot]:
        entries = await reader.read(block=block)
        return len(entries), prepare(entries)

    try:
        claimed = await reader.upkeep()
        if not reader.streams:
            await asyncio.sleep(reader.config.block_ms / 1000)
            return 0
        done = await handle(prepare(claimed))
        count, lot = await read(block=not done)
        until = time.monotonic() + BACKLOG_PASS_S
        while True:
            ahead = None
            if reader.more_waiting and time.monotonic() < until:
                ahead = asyncio.ensure_future(read(block=False))
            handed = time.monotonic()
            try:
                done += await handle(lot)
            except BaseException:
                if ahead is not None:
                    await reader.abandon(ahead)
                raise
            if ahead is None:
                break
            if reader.pending_next:  # the lot left entries pending: none after them goes first
                await reader.abandon(ahead)
                break
            if time.monotonic() - handed > BACKLOG_PASS_S:  # the sink stalled
                await reader.abandon(ahead)
                break
            count, lot = await ahead
        await reader.trim_if_due()
        if linger_s and 0 < count < reader.config.batch_size:
            await asyncio.sleep(linger_s)
        return done
    except REDIS_UNAVAILABLE:
        reader.redis_failed()
        raise
    except ResponseError as exc:
        # NOGROUP alone, or inside a cluster pipeline's "Command # n (...) of pipeline caused
        # error"; UNBLOCKED: a read blocked on a stream that was deleted (Redis 7).
        if "NOGROUP" not in str(exc) and not str(exc).startswith("UNBLOCKED"):
            raise
        log.warning("%s: a stream lost its consumer group (%s); rediscovering", reader.group, exc)
        reader.forget_streams()
        return 0
