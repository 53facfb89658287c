"""The operator's dashboard: one snapshot of the items' stock and streams, and of this process's
own counters, cheap enough to take every second.

Redis is read in two round trips (three on Redis 6.2, which keeps no consumer-group lag): the
items registry, then the items' counters beside their streams (``seckill.engine.streams``) and
their waiting rooms, concurrently. Dead letters and refunds owed come from SQL, and the request,
reaper and reconciler figures from the process's metrics registry when it has one.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy.exc import SQLAlchemyError

from seckill.domain.items import STOCK_FIELDS, Stock
from seckill.engine.cluster import time_ms
from seckill.engine.engine import RedisEngine
from seckill.engine.queues import QueueCounts, Queues
from seckill.engine.streams import GROUP, GroupProgress, read_progress
from seckill.observability import metrics
from seckill.store.database import is_transient
from seckill.store.ledger import Ledger
from seckill.store.payments import Owed

NOTHING_OWED = Owed(0, {})

# The registry holds every item ever loaded; a page about the sale at hand shows the newest.
MAX_ITEMS = 50


@dataclass(frozen=True, slots=True)
class ItemView:
    """One item as the dashboard shows it."""

    item_id: int
    stock: Stock | None  # None: not in Redis (never warmed, or Redis lost it)
    persister: GroupProgress  # where the persister stands in the item's stream
    dead_letters: int | None  # not replayed yet; None when SQL did not answer
    queue: QueueCounts | None = None  # its waiting room; None: nobody joined
    # Every other consumer group's backlog (a bridge to a broker: "bridge-nats"), by group.
    sinks: dict[str, int] = field(default_factory=dict)
    refunds_owed: Owed | None = None  # not given back yet; None when SQL did not answer


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
    chosen = sorted(set(item_ids)) if item_ids else (await engine.item_ids())[-MAX_ITEMS:]
    (server_time_ms, stocks), streams, in_registry, queues = await asyncio.gather(
        _clock_and_stock(engine, chosen),
        read_progress(engine.redis, [engine.keys(i).events for i in chosen]),
        engine.item_count(),
        Queues(engine).counts(chosen),
    )
    dead, owed, database_available = await _from_sql(engine, ledger, chosen)
    views = [
        ItemView(
            item_id,
            stock,
            stream.of(GROUP),
            dead.get(item_id),
            queue,
            {name: g.backlog for name, g in stream.groups.items() if name != GROUP},
            owed.get(item_id, NOTHING_OWED) if database_available else None,
        )
        for item_id, stock, stream, queue in zip(chosen, stocks, streams, queues, strict=True)
    ]
    return DashboardSnapshot(
        server_time_ms=server_time_ms,
        items=views,
        items_in_registry=in_registry,
        database_available=database_available,
        metrics=read_metrics(),
    )


async def _clock_and_stock(
    engine: RedisEngine, item_ids: Sequence[int]
) -> tuple[int, list[Stock | None]]:
    """Redis's clock (ms) and each item's counters (None: not in Redis), read side by side (a
    cluster keeps TIME out of a pipeline)."""

    async def counters() -> list[Any]:
        async with engine.redis.pipeline(transaction=False) as pipe:
            for item_id in item_ids:
                pipe.hmget(engine.keys(item_id).item, list(STOCK_FIELDS))
            return await pipe.execute()

    now_ms, replies = await asyncio.gather(time_ms(engine.redis), counters())
    stocks = []
    for values in cast(list[list[str | None]], replies):
        missing = any(v is None for v in values)
        stocks.append(None if missing else Stock(*(int(v or 0) for v in values)))
    return now_ms, stocks


async def _from_sql(
    engine: RedisEngine, ledger: Ledger, item_ids: Sequence[int]
) -> tuple[dict[int, int], dict[int, Owed], bool]:
    """Dead letters and refunds owed per item, and whether SQL answered: the dashboard matters
    most while it does not, so its absence leaves these blank instead of failing the whole
    snapshot."""
    try:
        counts = await asyncio.gather(
            *(ledger.dead_letter_count(engine.keys(i).events) for i in item_ids)
        )
        owed = await ledger.payments.owed(item_ids)
    except (SQLAlchemyError, OSError) as exc:
        if not is_transient(exc):
            raise
        return {}, {}, False
    return dict(zip(item_ids, counts, strict=True)), owed, True


def read_metrics() -> ProcessMetrics:
    """Every sample of the process's metrics registry (every process's, sharing a directory)."""
    samples: dict[str, list[Sample]] = defaultdict(list)
    for family in metrics.registry().collect():
        for sample in family.samples:
            samples[sample.name].append(Sample(dict(sample.labels), float(sample.value)))
    return ProcessMetrics(samples=dict(samples), shared=metrics.multiprocess_dir() is not None)
