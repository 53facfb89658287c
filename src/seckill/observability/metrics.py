"""Every Prometheus metric of seckill, defined once, here.

Code that counts something imports this module and touches the metric where the thing happens
(``metrics.SHED.inc()``): an in-process increment, never a round trip. The one exception are
the stream gauges, which ``seckill.engine.streams.refresh_stream_gauges`` reads from Redis when
``/metrics`` is scraped. Nothing here reads Redis or imports the engine: the metrics are the
floor every other module may count on.

Names follow Prometheus conventions: a ``seckill_`` prefix, ``_total`` on counters, base units
(``_seconds``). Every label has a bounded set of values: HTTP routes are route templates, never
raw paths; items are the ids in the items registry.

**Several processes.** With ``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is
first imported (``seckill serve``, ``seckill api`` and ``seckill worker ...`` set it from
``SECKILL_METRICS_DIR``), every process writes its samples into files in that directory and
``registry()`` collects them all: counters and histograms are summed over processes, each gauge
is combined as its ``multiprocess_mode`` says. Without it, ``registry()`` is the process's own
default registry.

To read current values in process (a dashboard, a test), collect ``registry()``:
``for family in registry().collect(): ...`` gives each metric with its samples.
"""

from __future__ import annotations

import os
import time
from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client import values as _values

# -- HTTP (the ASGI middleware in seckill.api.metrics) -------------------------------------------

HTTP_REQUESTS = Counter(
    "seckill_http_requests_total",
    "HTTP requests answered, by route template (`other` for paths no route matches) and "
    "outcome: the error code of the body for status >= 400, else `reserved` on the purchase "
    "route and the status code elsewhere.",
    ["route", "outcome"],
)
HTTP_REQUEST_DURATION = Histogram(
    "seckill_http_request_duration_seconds",
    "Time from a request's arrival to the end of its answer, by route template.",
    ["route"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

# -- The stores, as the probes see them (seckill.api.health) -------------------------------------

DEPENDENCY_UP = Gauge(
    "seckill_dependency_up",
    "1 if the dependency (`redis`, `database`) answered the last probe of this process "
    "(/readyz or /healthz) within its bound, else 0.",
    ["dependency"],
    multiprocess_mode="mostrecent",
)

# -- Redis ---------------------------------------------------------------------------------------

REDIS_SCRIPT_DURATION = Histogram(
    "seckill_redis_script_duration_seconds",
    "Time of one Lua script call as the caller sees it (round trip included; with durability "
    "`replicas`, the WAIT too), by script.",
    ["script"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)

# Set by whichever API process was scraped last: the same Redis answers every process.
STREAM_LENGTH = Gauge(
    "seckill_stream_length",
    "Entries in the item's event stream (XLEN) at the last scrape: the backlog plus entries "
    "acknowledged but not trimmed yet.",
    ["item"],
    multiprocess_mode="mostrecent",
)
STREAM_PENDING = Gauge(
    "seckill_stream_pending",
    "Entries of the item's stream delivered to the consumer group but not acknowledged yet, at "
    "the last scrape.",
    ["item", "group"],
    multiprocess_mode="mostrecent",
)
STREAM_LAG = Gauge(
    "seckill_stream_lag",
    "Entries of the item's stream not delivered to the consumer group yet, at the last scrape. "
    "Exact on Redis 7 (its `lag`); on Redis 6.2, which keeps none, the entries after the "
    "group's last delivered one, counted up to a cap.",
    ["item", "group"],
    multiprocess_mode="mostrecent",
)
STREAM_OLDEST_AGE = Gauge(
    "seckill_stream_oldest_age_seconds",
    "Seconds since the oldest entry of the item's stream the consumer group has not "
    "acknowledged yet was added (0: none), by Redis's clock, at the last scrape: how long the "
    "oldest order has waited for its sink, whatever the size of the sale.",
    ["item", "group"],
    multiprocess_mode="mostrecent",
)

# -- The persister -------------------------------------------------------------------------------

PERSISTER_BATCH_SIZE = Histogram(
    "seckill_persister_batch_size",
    "Entries landed in SQL per landed batch.",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
)
PERSISTER_ROWS = Counter(
    "seckill_persister_rows_total",
    "Stream entries (events) landed in SQL and acknowledged; rate() gives events per second.",
)
SQL_TRANSACTIONS = Counter(
    "seckill_sql_transactions_total",
    "Persister transactions, by result: `commit`; `race` (another persister took a key of the "
    "batch first: it is tried again at once); or `failure` (the database was down, or the batch "
    "could not land and is split or retried).",
    ["result"],
)
DEAD_LETTERS = Counter(
    "seckill_dead_letters_total",
    "Stream entries the persister gave up on (dead letters written). Those not replayed yet are "
    'seckill_reconciler_drift{kind="dead_letters"}.',
)

# -- The reaper ----------------------------------------------------------------------------------

REAPER_RELEASES = Counter(
    "seckill_reaper_releases_total",
    "Holds released by the reaper because their deadline passed.",
)
ITEMS_ARCHIVED = Counter(
    "seckill_items_archived_total",
    "Items archived: settled, their keys removed from Redis (SQL answers for them).",
)
REAPER_LAST_PASS = Gauge(
    "seckill_reaper_last_pass_timestamp_seconds",
    "Unix time at which a reaper last finished a pass (the latest over every process).",
    multiprocess_mode="max",
)

# -- The reconciler ------------------------------------------------------------------------------

RECONCILER_PASSES = Counter(
    "seckill_reconciler_passes_total",
    "Reconciler passes completed (by the replica holding the upkeep lock).",
)
RECONCILER_DRIFT = Gauge(
    "seckill_reconciler_drift",
    "Findings of each drift kind in the last reconciler pass, over every item (0: none).",
    ["kind"],
    multiprocess_mode="mostrecent",
)
RECONCILER_LAST_PASS = Gauge(
    "seckill_reconciler_last_pass_timestamp_seconds",
    "Unix time at which the reconciler last finished a pass (the latest over every process).",
    multiprocess_mode="max",
)
REFUNDS_OWED = Gauge(
    "seckill_refunds_owed",
    "Refunds owed and not marked refunded yet, over every item in SQL, archived ones included, "
    "as the reconciler's last pass counted them.",
    multiprocess_mode="mostrecent",
)

# -- Protecting Redis and SQL from a crowd -------------------------------------------------------

ITEM_CACHE_LOOKUPS = Counter(
    "seckill_item_cache_lookups_total",
    "Item cache lookups by tier and result. `memory`: every read (a miss goes on to a load, "
    "possibly shared with other readers); `redis`: every load (a hit is a card, fresh or stale, "
    "or a known-absent id; a miss reads SQL).",
    ["tier", "result"],
)
SOLD_OUT_FLAG_HITS = Counter(
    "seckill_sold_out_flag_hits_total",
    "Requests answered sold out from this process's sold-out flag, by request: `purchase` "
    "(no script run, one GET of its idempotency record), `ticket` (refused, no Redis call), "
    "`item` (a buyer's item read showing 0 left, no read of the counters).",
    ["request"],
)
RATE_LIMITED = Counter(
    "seckill_rate_limited_total",
    "Purchase attempts answered 429 rate_limited: over the buyer's limit per item and window.",
)
SHED = Counter(
    "seckill_shed_total",
    "Purchases shed by admission (503 overloaded) because too many were in flight.",
)


# -- The waiting room ----------------------------------------------------------------------------

# Set by the inlet, which one process runs at a time (the upkeep lease).
QUEUE_LENGTH = Gauge(
    "seckill_queue_length",
    "Positions given in the item's waiting room (pre-start joiners count from the start).",
    ["item"],
    multiprocess_mode="mostrecent",
)
QUEUE_ADMITTED = Gauge(
    "seckill_queue_admitted",
    "The item's admission frontier: every position up to it may take a purchase ticket.",
    ["item"],
    multiprocess_mode="mostrecent",
)
QUEUE_ADMISSIONS = Counter(
    "seckill_queue_admissions",
    "Positions let in by the inlet (its rate is the queue's pace).",
    ["item"],
)
QUEUE_JOINS = Counter("seckill_queue_joins_total", "Buyers who joined a waiting room.")
QUEUE_WAIT = Histogram(
    "seckill_queue_wait_seconds",
    "From joining (or the start, for a pre-start joiner) to a ticket: observed at each ticket "
    "given to a queued buyer (a buyer usually takes one).",
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)


# -- The bridge to a broker (its backlog is the stream gauges' group "bridge-<sink>") --------------

BRIDGE_PUBLISHED = Counter(
    "seckill_bridge_published",
    "Events the broker confirmed (and the bridge then acknowledged in the stream), by sink.",
    ["sink"],
)
BRIDGE_RETRIES = Counter(
    "seckill_bridge_retries",
    "Batches published again: the broker was unreachable, did not confirm, or refused some.",
    ["sink"],
)
BRIDGE_DEAD_LETTERS = Counter(
    "seckill_bridge_dead_letters",
    "Events the bridge gave up on (refused by the broker every time, or unreadable), by sink.",
    ["sink"],
)


def multiprocess_dir() -> str | None:
    """The directory the metrics of every process go to, or None in single-process mode.

    Decided by ``prometheus_client`` when first imported, not by the environment now."""
    if not cast(Any, _values.ValueClass)._multiprocess:
        return None
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def registry() -> CollectorRegistry:
    """The registry to collect from: in multi-process mode a fresh one that reads every
    process's files (sums, as each metric's mode says), else the process's default registry."""
    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]
    return merged


EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_LATEST


def exposition() -> bytes:
    """Every metric of ``registry()`` in Prometheus's text format (``EXPOSITION_CONTENT_TYPE``):
    what ``/metrics`` answers, on an API process and on a worker's listener alike."""
    return generate_latest(registry())


def record_reconciler_pass(
    kinds: Iterable[str], found: Iterable[str], *, refunds_owed: int | None = None
) -> None:
    """A reconciler pass ended: count it, set the drift gauge of every kind in ``kinds`` to
    the findings of that kind in ``found`` (0 when none), and the refunds owed if counted."""
    counts = Tally(found)
    for kind in kinds:
        RECONCILER_DRIFT.labels(kind=kind).set(counts[kind])
    if refunds_owed is not None:
        REFUNDS_OWED.set(refunds_owed)
    RECONCILER_PASSES.inc()
    RECONCILER_LAST_PASS.set(time.time())
