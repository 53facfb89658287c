"""The operator's dashboard: one snapshot of the items' stock and streams, and of this process's
own counters, cheap enough to take every second.

Redis is read in two round trips (three on Redis 6.2, which keeps no consumer-group lag): the
items registry, then one pipeline with every item's counters and stream. Dead letters come from
SQL, and the request, reaper and reconciler figures from the process's metrics registry when it
has one.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.exceptions import ResponseError
from sqlalchemy.exc import SQLAlchemyError

from seckill.domain.items import Stock
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import items_registry
from seckill.observability import metrics
from seckill.store.database import is_transient
from seckill.store.ledger import Ledger
from seckill.workers.persister import GROUP

# The registry holds every item ever loaded; a page about the sale at hand shows the newest.
MAX_ITEMS = 50
_STOCK_FIELDS = ("total", "available", "held", "sold")
# Redis 6.2 keeps no lag: the unread entries are counted, up to this many.
_LAG_COUNT_CAP = 100_000


@dataclass(frozen=True, slots=True)
class ItemView:
    """One item as the dashboard shows it."""

    item_id: int
    stock: Stock | None  # None: not in Redis (never warmed, or Redis lost it)
    pending: int  # delivered to the persister, not acknowledged yet
    lag: int  # not delivered to the persister yet
    dead_letters: int | None  # not replayed yet; None when SQL did not answer

    @property
    def backlog(self) -> int:
        """Entries the persister has not landed yet (as ``seckill.workers.persister.backlog``)."""
        return self.pending + self.lag


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class ProcessMetrics:
    """Samples of this process's metrics registry, by sample name (a counter's ``_total``
    included)."""

    samples: Mapping[str, Sequence[Sample]] = field(default_factory=dict)
    # Summed over every process sharing a metrics directory, rather than this process's own.
    shared: bool = False

    def total(self, name: str) -> float | None:
        """The sum over every label set, or None if there is no such sample."""
        found = self.samples.get(name)
        return None if not found else sum(s.value for s in found)

    def latest(self, name: str) -> float | None:
        """The largest value (for timestamps: the most recent), or None."""
        found = self.samples.get(name)
        return None if not found else max(s.value for s in found)

    def by(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        """Values summed over every label but ``labels``."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for sample in self.samples.get(name, ()):
            out[tuple(sample.labels.get(label, "") for label in labels)] += sample.value
        return dict(out)


@dataclass(frozen=True, slots=True)
class DashboardSnapshot:
    server_time_ms: int  # Redis's clock, the one every process shares
    items: list[ItemView]
    items_in_registry: int
    database_available: bool
    metrics: ProcessMetrics


async def take_snapshot(
    engine: RedisEngine, ledger: Ledger, item_ids: Sequence[int] | None = None
) -> DashboardSnapshot:
    """The items given (else the newest ``MAX_ITEMS`` of the registry), their dead letters,
    and this process's metrics."""
    redis = engine.redis
    registry = items_registry(engine.prefix)
    if item_ids:
        chosen = sorted(set(item_ids))
    else:
        registered = {int(i) for i in await redis.smembers(registry)}
        chosen = sorted(sorted(registered, reverse=True)[:MAX_ITEMS])
    async with redis.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.scard(registry)
        for item_id in chosen:
            keys = engine.keys(item_id)
            pipe.hmget(keys.item, list(_STOCK_FIELDS))
            pipe.xinfo_groups(keys.events)
            pipe.xlen(keys.events)
        replies = await pipe.execute(raise_on_error=False)
    clock, in_registry = replies[:2]
    for reply in (clock, in_registry):
        if isinstance(reply, Exception):
            raise reply
    sec, usec = clock
    streams = [_Stream.read(*replies[2 + 3 * n : 5 + 3 * n]) for n in range(len(chosen))]
    await _count_unread(engine, chosen, streams)
    dead, database_available = await _dead_letters(engine, ledger, chosen)
    return DashboardSnapshot(
        server_time_ms=int(sec) * 1000 + int(usec) // 1000,
        items=[
            ItemView(
                item_id=item_id,
                stock=stream.stock,
                pending=stream.pending,
                lag=stream.lag or 0,
                dead_letters=dead.get(item_id),
            )
            for item_id, stream in zip(chosen, streams, strict=True)
        ],
        items_in_registry=int(in_registry),
        database_available=database_available,
        metrics=read_metrics(),
    )


@dataclass(slots=True)
class _Stream:
    stock: Stock | None
    pending: int
    lag: int | None  # None: Redis did not say (6.2)
    last_delivered_id: str

    @classmethod
    def read(cls, counters: Any, groups: Any, length: Any) -> _Stream:
        for reply in (counters, length):
            if isinstance(reply, Exception):
                raise reply
        values = cast(list[str | None], counters)
        stock = None if any(v is None for v in values) else Stock(*(int(v or 0) for v in values))
        if isinstance(groups, ResponseError):  # no stream yet
            return cls(stock, 0, 0, "")
        if isinstance(groups, Exception):
            raise groups
        group = next((g for g in cast(list[dict[str, Any]], groups) if g["name"] == GROUP), None)
        if group is None:  # no persister has looked yet: every entry waits
            return cls(stock, 0, int(length), "")
        lag = group.get("lag")
        return cls(
            stock,
            int(group["pending"]),
            None if lag is None else int(lag),
            str(group["last-delivered-id"]),
        )


async def _count_unread(
    engine: RedisEngine, item_ids: Sequence[int], streams: Sequence[_Stream]
) -> None:
    unknown = [(i, s) for i, s in zip(item_ids, streams, strict=True) if s.lag is None]
    if not unknown:
        return
    async with engine.redis.pipeline(transaction=False) as pipe:
        for item_id, stream in unknown:
            pipe.xrange(
                engine.keys(item_id).events,
                min="(" + stream.last_delivered_id,
                count=_LAG_COUNT_CAP,
            )
        pages = await pipe.execute()
    for (_, stream), page in zip(unknown, pages, strict=True):
        stream.lag = len(page or ())


async def _dead_letters(
    engine: RedisEngine, ledger: Ledger, item_ids: Sequence[int]
) -> tuple[dict[int, int], bool]:
    """Dead letters per item, and whether SQL answered: the dashboard matters most while it
    does not, so its absence leaves these blank instead of failing the whole snapshot."""
    try:
        counts = await asyncio.gather(
            *(ledger.dead_letter_count(engine.keys(i).events) for i in item_ids)
        )
    except (SQLAlchemyError, OSError) as exc:
        if not is_transient(exc):
            raise
        return {}, False
    return dict(zip(item_ids, counts, strict=True)), True


def read_metrics() -> ProcessMetrics:
    """Every sample of the process's metrics registry (every process's, sharing a directory)."""
    samples: dict[str, list[Sample]] = defaultdict(list)
    for family in metrics.registry().collect():
        for sample in family.samples:
            samples[sample.name].append(Sample(dict(sample.labels), float(sample.value)))
    return ProcessMetrics(samples=dict(samples), shared=metrics.multiprocess_dir() is not None)
