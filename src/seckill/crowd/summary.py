"""A crowd's log summed up as a ``CrowdResult``: rates, latency percentiles and histograms,
the stock over time, and the verdicts."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from datetime import datetime

from seckill import __version__
from seckill.crowd.crowd import CrowdLog
from seckill.crowd.plan import CrowdPlan
from seckill.crowd.result import (
    SCHEMA,
    CrowdResult,
    HistogramSeries,
    LatencyHistogram,
    OutcomeRow,
    PlanOut,
    StockSeries,
    Timeline,
    WaitingRoomOut,
)
from seckill.engine.audit import Check

# Latency bins: 0.1 ms to 10 s, five per decade; the last bin takes everything slower.
EDGES_MS = [round(10 ** (k / 5 - 1), 4) for k in range(26)]
_TIMELINE_POINTS = 120


def percentile(sorted_ms: list[float], q: float) -> float:
    """The nearest-rank percentile of an ascending list (0 for none)."""
    if not sorted_ms:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_ms)))
    return round(sorted_ms[rank - 1], 3)


def summarize(
    *,
    kind: str,
    target: str,
    started_at: datetime,
    plan: CrowdPlan,
    item_id: int,
    log: CrowdLog,
    elapsed_s: float,
    checks: list[Check],
    waiting_room: WaitingRoomOut | None = None,
) -> CrowdResult:
    samples = log.samples
    crowd_s = log.crowd_s or elapsed_s
    requests = len(samples)
    result = CrowdResult(
        schema=SCHEMA,
        kind="demo" if kind == "demo" else "bench",
        seckill_version=__version__,
        target=target,
        started_at=started_at.isoformat(),
        plan=_plan(plan),
        item_id=item_id,
        crowd_s=round(crowd_s, 3),
        elapsed_s=round(elapsed_s, 3),
        requests=requests,
        transport_errors=sum(1 for s in samples if s[2] == "transport_error"),
        throughput_rps=round(requests / crowd_s, 1) if crowd_s else 0.0,
        buyers=log.buyers_sent,
        buyers_per_s=round(log.buyers_sent / crowd_s, 1) if crowd_s else 0.0,
        outcomes=_outcomes(log, crowd_s),
        timeline=_timeline(log),
        latency_histogram=_histogram(log),
        stock=_stock(log),
        verdicts=[{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        passed=all(c.ok for c in checks),
    )
    if waiting_room is not None:
        result["waiting_room"] = waiting_room
    return result


def _plan(plan: CrowdPlan) -> PlanOut:
    return PlanOut(
        buyers=plan.buyers, late_buyers=plan.late_crowd, concurrency=plan.concurrency,
        duration_s=plan.duration_s, units=plan.units, per_buyer_limit=plan.per_buyer_limit,
        hold_seconds=plan.hold_seconds, pay=plan.pay, fail=plan.fail, cancel=plan.cancel,
        replay=plan.replay, seed=plan.seed,
    )  # fmt: skip


def _grouped(log: CrowdLog) -> dict[tuple[str, str], list[float]]:
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _, action, outcome, ms in log.samples:
        groups[action, outcome].append(ms)
    return groups


def _outcomes(log: CrowdLog, crowd_s: float) -> list[OutcomeRow]:
    rows = []
    for (action, outcome), latencies in _grouped(log).items():
        latencies.sort()
        rows.append(
            OutcomeRow(
                action=action, outcome=outcome, count=len(latencies),
                rps=round(len(latencies) / crowd_s, 1) if crowd_s else 0.0,
                p50_ms=percentile(latencies, 0.5), p95_ms=percentile(latencies, 0.95),
                p99_ms=percentile(latencies, 0.99),
            )
        )  # fmt: skip
    return sorted(rows, key=lambda r: (-r["count"], r["action"], r["outcome"]))


def _timeline(log: CrowdLog) -> Timeline:
    if not log.samples:
        return Timeline(interval_s=1.0, t_s=[], requests_per_s=[])
    end = max(t for t, *_ in log.samples)
    # Round the interval to a readable step so the chart has at most ~120 points.
    steps = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
    interval = next((s for s in steps if end / s <= _TIMELINE_POINTS), end / _TIMELINE_POINTS)
    counts = [0] * (int(max(end, 0) / interval) + 1)
    for t, *_ in log.samples:
        counts[int(max(t, 0) / interval)] += 1
    return Timeline(
        interval_s=float(interval),
        t_s=[round(i * interval, 3) for i in range(len(counts))],
        requests_per_s=[round(n / interval, 1) for n in counts],
    )


def _histogram(log: CrowdLog) -> LatencyHistogram:
    series = []
    for (action, outcome), latencies in sorted(_grouped(log).items()):
        counts = [0] * (len(EDGES_MS) - 1)
        for ms in latencies:
            counts[min(max(bisect.bisect_right(EDGES_MS, ms) - 1, 0), len(counts) - 1)] += 1
        series.append(HistogramSeries(action=action, outcome=outcome, counts=counts))
    return LatencyHistogram(edges_ms=EDGES_MS, series=series)


def _stock(log: CrowdLog) -> StockSeries:
    points = log.stock
    return StockSeries(
        t_s=[round(p.t, 3) for p in points],
        available=[p.available for p in points],
        held=[p.held for p in points],
        sold=[p.sold for p in points],
        backlog=[p.backlog for p in points],
    )
