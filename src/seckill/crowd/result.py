"""The result of a crowd run, as written to ``<name>.json`` and drawn in ``<name>.html``.

One shape for the demo and the bench; every figure a report shows is a field here. Times are
seconds from the first request; latencies are milliseconds.
"""

from __future__ import annotations

from typing import Literal, TypedDict

SCHEMA = "seckill.crowd/1"


class PlanOut(TypedDict):
    buyers: int  # the first crowd (a cap when duration_s is set)
    late_buyers: int  # the second crowd, for the units that came back
    concurrency: int  # buyers in flight at once
    duration_s: float | None  # the first crowd stops arriving after this long
    units: int
    per_buyer_limit: int
    hold_seconds: int
    pay: float  # shares of reserving buyers: pay, payment fails, cancel; the rest let it expire
    fail: float
    cancel: float
    replay: float  # share of buyers who send their purchase twice with the same key
    seed: int


class OutcomeRow(TypedDict):
    action: str  # ticket, buy, replay, pay, cancel, check
    outcome: str  # reserved, sold_out, paid, ... or an HTTP error's code
    count: int
    rps: float  # count / the crowd's wall time
    p50_ms: float
    p95_ms: float
    p99_ms: float


class Timeline(TypedDict):
    interval_s: float
    t_s: list[float]  # the start of each interval
    requests_per_s: list[float]


class HistogramSeries(TypedDict):
    action: str
    outcome: str
    counts: list[int]  # len(edges_ms) - 1 bins; the last bin takes everything above


class LatencyHistogram(TypedDict):
    edges_ms: list[float]
    series: list[HistogramSeries]


class StockSeries(TypedDict):
    t_s: list[float]
    available: list[int]
    held: list[int]
    sold: list[int]
    backlog: list[int]  # stream entries not yet landed in SQL


class VerdictOut(TypedDict):
    name: str
    ok: bool
    detail: str


class CrowdResult(TypedDict):
    schema: str  # SCHEMA
    kind: Literal["demo", "bench"]
    seckill_version: str
    target: str  # the API's base URL
    started_at: str  # RFC 3339
    plan: PlanOut
    item_id: int
    crowd_s: float  # wall time of the crowds (both waves), the denominator of every rate
    elapsed_s: float  # from the first request to the end of the audit
    requests: int
    transport_errors: int  # requests that got no HTTP answer (refused, reset, timed out)
    throughput_rps: float  # requests / crowd_s
    buyers: int  # buyers sent through the sale (both waves), each on their whole journey
    buyers_per_s: float  # buyers / crowd_s: journeys (ticket, purchase, what follows) a second
    outcomes: list[OutcomeRow]
    timeline: Timeline
    latency_histogram: LatencyHistogram
    stock: StockSeries
    verdicts: list[VerdictOut]
    passed: bool
