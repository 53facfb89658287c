"""The item cache: what buyers see of an item, read by thousands at once without a stampede on SQL.

Three layers, each in front of the next:

1. **In-process**, for ``item_cache_local_seconds``: a reader finds the item in memory.
2. **Redis**, a *card* per item (``seckill:{item:<id>}:card``, JSON): fresh for
   ``item_cache_redis_seconds`` plus a random jitter (so items loaded together do not expire
   together), then kept one more TTL as a *stale* card that may be served while it is reloaded.
   A card that would expire while its item is on sale — from ``sale_lead_seconds`` before the
   start until the end — lives until the sale has ended instead.
3. **SQL** (the record), read by one loader per item across every process: on a miss a process
   takes the card's lock (a ``Lease``, see ``seckill.engine.leases``; dropped, never renewed),
   checks the card again, loads, writes the card, releases. Readers in the same process await
   the same load; other processes serve the stale card if there is one, or poll for the new one
   for up to ``wait_seconds``, and then load from SQL themselves without writing the card (only
   the lock's owner writes, so a slow reader cannot overwrite a newer card). A lock whose owner
   died lapses after ``lock_ms``.

An id SQL does not know is cached as absent: in Redis for ``item_absent_seconds``, in memory for
the shorter of that and the local TTL. Errors are never cached: the next reader tries again.

``available`` is never cached: every reader gets a value Redis answered after the reader asked
(see ``available``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

from seckill.domain.items import ItemRecord
from seckill.domain.times import datetime_to_ms
from seckill.engine.cluster import REDIS_FAILED, RedisClient
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import item_card_key, item_card_lock_key
from seckill.engine.leases import Lease
from seckill.observability import metrics

log = logging.getLogger(__name__)

CARD_VERSION = 4  # 2: with stock_shards; 3: with the waiting room; 4: with the currency
_MEMORY_HIT = metrics.ITEM_CACHE_LOOKUPS.labels(tier="memory", result="hit")
_MEMORY_MISS = metrics.ITEM_CACHE_LOOKUPS.labels(tier="memory", result="miss")
_REDIS_HIT = metrics.ITEM_CACHE_LOOKUPS.labels(tier="redis", result="hit")
_REDIS_MISS = metrics.ITEM_CACHE_LOOKUPS.labels(tier="redis", result="miss")
T = TypeVar("T")


class ItemSource(Protocol):
    """Where items come from on a miss: the Ledger (SQL)."""

    async def item(self, item_id: int) -> ItemRecord | None: ...


@dataclass(slots=True)
class ItemCacheStats:
    """Counters since the cache was made, for tests and metrics.

    Every read is counted exactly once in one of: ``local_hits`` (in memory), ``absent_hits``
    (known absent, in memory or in Redis), ``coalesced`` (awaited a load another reader in
    this process started), ``redis_hits`` (a fresh card), ``stale_hits`` (a stale card, while
    another process reloads it) or ``sql_loads`` (read SQL, found or not). ``lock_waits`` counts
    loads that found the lock taken and polled for the card; ``unlocked_loads`` those that then
    gave up waiting and read SQL without the lock (also in ``sql_loads``).
    """

    local_hits: int = 0
    absent_hits: int = 0
    coalesced: int = 0
    redis_hits: int = 0
    stale_hits: int = 0
    sql_loads: int = 0
    lock_waits: int = 0
    unlocked_loads: int = 0

    @property
    def reads(self) -> int:
        return (
            self.local_hits + self.absent_hits + self.coalesced
            + self.redis_hits + self.stale_hits + self.sql_loads
        )  # fmt: skip

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Card:
    record: ItemRecord | None  # None: SQL does not know the id
    fresh: bool


def encode_card(record: ItemRecord | None, *, grace_ms: int) -> str:
    """A card as stored in Redis. ``grace_ms``: the last stretch of the card's TTL in which it is
    stale (served only while it is reloaded)."""
    if record is None:
        return json.dumps({"v": CARD_VERSION, "absent": True})
    return json.dumps(
        {
            "v": CARD_VERSION,
            "grace_ms": grace_ms,
            "item": {
                "item_id": record.item_id,
                "name": record.name,
                "price_cents": record.price_cents,
                "currency": record.currency,
                "total": record.total,
                "starts_at": record.starts_at.isoformat(),
                "ends_at": record.ends_at.isoformat(),
                "per_buyer_limit": record.per_buyer_limit,
                "hold_seconds": record.hold_seconds,
                "stock_shards": record.stock_shards,
                "waiting_room": record.waiting_room,
                "queue_admit_per_second": record.queue_admit_per_second,
                "queue_open_seconds": record.queue_open_seconds,
            },
        },
        separators=(",", ":"),
    )


def _decode_card(raw: str, pttl: int) -> _Card | None:
    """The card, fresh or stale by its remaining TTL (Redis's clock, not ours); None if it is not
    one this version understands (it is then reloaded and overwritten)."""
    try:
        body = json.loads(raw)
        if body.get("v") != CARD_VERSION:
            return None
        if body.get("absent") is True:
            return _Card(None, fresh=True)
        item = body["item"]
        record = ItemRecord(
            item_id=int(item["item_id"]),
            name=str(item["name"]),
            price_cents=int(item["price_cents"]),
            currency=str(item["currency"]),
            total=int(item["total"]),
            starts_at=datetime.fromisoformat(item["starts_at"]),
            ends_at=datetime.fromisoformat(item["ends_at"]),
            per_buyer_limit=int(item["per_buyer_limit"]),
            hold_seconds=int(item["hold_seconds"]),
            stock_shards=int(item["stock_shards"]),
            waiting_room=item["waiting_room"] is True,
            queue_admit_per_second=_optional_int(item["queue_admit_per_second"]),
            queue_open_seconds=_optional_int(item["queue_open_seconds"]),
        )
        grace_ms = int(body["grace_ms"])
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("unreadable item card, reloading it: %.200r", raw)
        return None
    return _Card(record, fresh=pttl < 0 or pttl > grace_ms)  # -1: no TTL at all


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ItemCache:
    """Items as buyers see them, through memory, Redis and SQL (see the module's docstring).

    One per process (its memory and its in-flight loads are per process); safe to share between
    the tasks of one event loop.
    """

    def __init__(
        self,
        *,
        engine: RedisEngine,
        source: ItemSource,
        local_seconds: float,
        redis_seconds: float,
        jitter_seconds: float,
        absent_seconds: float,
        sale_lead_seconds: float,
        lock_ms: int = 3_000,
        wait_seconds: float = 1.0,
        poll_seconds: float = 0.05,
        local_max_items: int = 10_000,
        max_sql_loads: int = 8,
        clock: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self._engine = engine
        self._redis: RedisClient = engine.redis
        self._source = source
        self._prefix = engine.prefix
        self._local_s = local_seconds
        self._local_absent_s = min(local_seconds, absent_seconds)
        self._redis_ms = round(redis_seconds * 1000)
        self._jitter_ms = round(jitter_seconds * 1000)
        self._grace_ms = self._redis_ms
        self._absent_ms = round(absent_seconds * 1000)
        self._lead_ms = round(sale_lead_seconds * 1000)
        self._lock_ms = lock_ms
        self._wait_s = wait_seconds
        self._poll_s = poll_seconds
        self._local_max = local_max_items
        self._clock = clock
        # item id -> (expires at, monotonic seconds; the record, or None for absent)
        # Oldest first. An OrderedDict drops its oldest in O(1); a dict's first key is found
        # past every slot freed before it, a scan as long as the churn since its last resize.
        self._local: OrderedDict[int, tuple[float, ItemRecord | None]] = OrderedDict()
        self._loads: dict[int, asyncio.Task[ItemRecord | None]] = {}
        # Loads of many ids at once (a flood of unknown ids) take turns: they never drain the
        # SQL connection pool the rest of the process needs.
        self._sql_turns = asyncio.Semaphore(max_sql_loads)
        self._stock = _SharedReads(self._available)
        self.stats = ItemCacheStats()

    # -- reading ---------------------------------------------------------------------------------

    async def record(self, item_id: int) -> ItemRecord | None:
        """The item as SQL records it (at most a few TTLs old), or None if SQL has no such id."""
        cached = self._local.get(item_id)
        if cached is not None and cached[0] > time.monotonic():
            _MEMORY_HIT.inc()
            if cached[1] is None:
                self.stats.absent_hits += 1
            else:
                self.stats.local_hits += 1
            return cached[1]
        _MEMORY_MISS.inc()
        load = self._loads.get(item_id)
        if load is None:
            load = asyncio.create_task(self._load(item_id))
            self._loads[item_id] = load
            load.add_done_callback(partial(self._landed, item_id))
        else:
            self.stats.coalesced += 1
        # Shielded: a reader that goes away (a client hung up) does not cancel the others' load.
        return await asyncio.shield(load)

    async def available(self, item_id: int) -> int | None:
        """Units left now, from the engine's counters (None until the item is warmed).

        Not cached: concurrent readers share one round trip, and none gets a value Redis read
        before the reader asked (so a buyer sees their own purchase).
        """
        return await self._stock.read(item_id)

    async def _available(self, item_id: int) -> int | None:
        return await self._engine.available(item_id)

    def _landed(self, item_id: int, load: asyncio.Task[ItemRecord | None]) -> None:
        if self._loads.get(item_id) is load:
            del self._loads[item_id]
        if not load.cancelled():
            load.exception()  # its readers got it; retrieved here so asyncio does not warn

    async def _load(self, item_id: int) -> ItemRecord | None:
        card = await self._read_card(item_id)
        if card is not None and card.fresh:
            return self._hit(item_id, card)
        lock = self._card_lock(item_id)
        give_up_at: float | None = None
        if card is not None and self._sql_turns.locked():  # stale, and SQL is busy: no queueing
            self.stats.stale_hits += 1
            _REDIS_HIT.inc()
            return self._remember(item_id, card.record)
        while True:
            # The lock is taken with an SQL turn in hand, so it is held for the query, not for
            # the queue in front of it: waiters elsewhere then wait for milliseconds.
            async with self._sql_turns:
                if await lock.acquire():
                    try:
                        return await self._load_locked(item_id)
                    finally:
                        await self._unlock(lock)
            if card is not None:  # stale: good enough while its owner reloads it
                self.stats.stale_hits += 1
                _REDIS_HIT.inc()
                return self._remember(item_id, card.record)
            if give_up_at is None:
                give_up_at = time.monotonic() + self._wait_s
                self.stats.lock_waits += 1
            elif time.monotonic() >= give_up_at:
                break
            await asyncio.sleep(self._poll_s)
            card = await self._read_card(item_id)
            if card is not None and card.fresh:
                return self._hit(item_id, card)
        # The owner is slow (or died and its lock has not lapsed): never wait on it longer.
        async with self._sql_turns:
            self.stats.unlocked_loads += 1
            self.stats.sql_loads += 1
            _REDIS_MISS.inc()
            return self._remember(item_id, await self._source.item(item_id))

    async def _load_locked(self, item_id: int) -> ItemRecord | None:
        # The previous owner may have written the card between our read and our lock.
        card = await self._read_card(item_id)
        if card is not None and card.fresh:
            return self._hit(item_id, card)
        self.stats.sql_loads += 1
        _REDIS_MISS.inc()
        record = await self._source.item(item_id)
        await self._write_card(item_id, record)
        return self._remember(item_id, record)

    def _hit(self, item_id: int, card: _Card) -> ItemRecord | None:
        _REDIS_HIT.inc()
        if card.record is None:
            self.stats.absent_hits += 1
        else:
            self.stats.redis_hits += 1
        return self._remember(item_id, card.record)

    def _remember(self, item_id: int, record: ItemRecord | None) -> ItemRecord | None:
        ttl = self._local_s if record is not None else self._local_absent_s
        self._local[item_id] = (time.monotonic() + ttl, record)
        self._local.move_to_end(item_id)  # last: the entries stay in expiry order
        if len(self._local) > self._local_max:
            self._local.popitem(last=False)
        return record

    # -- the card --------------------------------------------------------------------------------

    async def _read_card(self, item_id: int) -> _Card | None:
        key = item_card_key(item_id, self._prefix)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            raw, pttl = cast(tuple[str | None, int], await pipe.execute())
        return None if raw is None else _decode_card(raw, pttl)

    def card_lifetime_ms(self, record: ItemRecord, now_ms: int) -> int:
        """How long a card written at ``now_ms`` stays fresh: the TTL plus jitter, or, if it
        would expire from ``sale_lead_seconds`` before the sale until its end, until the sale
        has ended (plus the TTL and jitter)."""
        lifetime = self._redis_ms + random.randint(0, self._jitter_ms)
        ends_ms = datetime_to_ms(record.ends_at)
        protected_from = datetime_to_ms(record.starts_at) - self._lead_ms
        if now_ms < ends_ms and now_ms + lifetime >= protected_from:
            return ends_ms - now_ms + lifetime
        return lifetime

    async def _write_card(self, item_id: int, record: ItemRecord | None) -> None:
        key = item_card_key(item_id, self._prefix)
        if record is None:
            await self._redis.set(key, encode_card(None, grace_ms=0), px=self._absent_ms)
            return
        lifetime = self.card_lifetime_ms(record, self._clock())
        await self._redis.set(
            key, encode_card(record, grace_ms=self._grace_ms), px=lifetime + self._grace_ms
        )

    def _card_lock(self, item_id: int) -> Lease:
        """The one loader of an item's card across processes (the card's writer)."""
        return Lease(
            self._redis,
            scripts=self._engine.scripts,
            key=item_card_lock_key(item_id, self._prefix),
            ttl_ms=self._lock_ms,
        )

    async def _unlock(self, lock: Lease) -> None:
        try:
            await lock.drop()
        except REDIS_FAILED as exc:  # it lapses by itself after lock_ms
            log.warning("could not release %s: %s", lock.key, exc)

    # -- writing ---------------------------------------------------------------------------------

    async def refresh(self, item_id: int) -> ItemRecord | None:
        """Read the item from SQL now and write its card (and this process's memory): after a
        change, when warming. Takes the card's lock (waiting for a load in progress, at most
        ``lock_ms``), so a load that read SQL before the change cannot overwrite the new card."""
        lock = self._card_lock(item_id)
        give_up_at = time.monotonic() + self._lock_ms / 1000
        owned = False
        while not owned and time.monotonic() < give_up_at:
            owned = await lock.acquire()
            if not owned:
                await asyncio.sleep(self._poll_s)
        try:
            record = await self._source.item(item_id)
            await self._write_card(item_id, record)
            return self._remember(item_id, record)
        finally:
            if owned:
                await self._unlock(lock)

    async def card_ttl_ms(self, item_id: int) -> int | None:
        """The card's remaining time in Redis (ms): -1 if it never expires, None if it has none."""
        ttl = int(await self._redis.pttl(item_card_key(item_id, self._prefix)))
        return None if ttl == -2 else ttl


class _SharedReads(Generic[T]):
    """Concurrent reads of one key share a round trip, and none gets a value read before it asked.

    A caller joins the read that has not been sent yet, or starts the next one; a read is sent
    once the previous read of its key is back. So at most one read per key is in flight, and at
    most one more is gathering callers, however many ask.
    """

    def __init__(self, read: Callable[[int], Awaitable[T]]) -> None:
        self._read = read
        self._gathering: dict[int, asyncio.Task[T]] = {}  # not sent yet: callers may join
        self._latest: dict[int, asyncio.Task[T]] = {}

    async def read(self, key: int) -> T:
        task = self._gathering.get(key)
        if task is None:
            task = asyncio.create_task(self._send(key, self._latest.get(key)))
            self._gathering[key] = self._latest[key] = task
            task.add_done_callback(partial(self._done, key))
        return await asyncio.shield(task)

    async def _send(self, key: int, previous: asyncio.Task[T] | None) -> T:
        if previous is not None:
            await asyncio.wait([previous])
        if self._gathering.get(key) is asyncio.current_task():
            del self._gathering[key]  # sent now: later callers need a later read
        return await self._read(key)

    def _done(self, key: int, task: asyncio.Task[Any]) -> None:
        for tasks in (self._gathering, self._latest):
            if tasks.get(key) is task:
                del tasks[key]
        if not task.cancelled():
            task.exception()


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
