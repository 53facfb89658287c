"""The crowd's plan and how its log is summed up: pure logic, no servers."""

from __future__ import annotations

import random
import re
from collections import Counter
from datetime import UTC, datetime

import pytest

from seckill.crowd.crowd import CrowdLog
from seckill.crowd.plan import CrowdPlan, Fate
from seckill.crowd.summary import EDGES_MS, percentile, summarize
from seckill.engine.audit import Check


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pay": 0.7, "cancel": 0.4}, "pay + fail + cancel must be at most 1"),
        ({"replay": 1.5}, "replay must be a share between 0 and 1"),
        ({"buyers": 0}, "must be at least 1"),
        ({"duration_s": 0}, "the duration must be positive"),
    ],
)
def test_a_bad_plan_is_refused_with_a_reason(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CrowdPlan(**options)  # type: ignore[arg-type]


def test_fates_follow_the_shares() -> None:
    plan = CrowdPlan(pay=0.5, fail=0.1, cancel=0.2)
    rng = random.Random(1)
    drawn = Counter(plan.fate(rng) for _ in range(20_000))
    for fate, share in ((Fate.PAY, 0.5), (Fate.FAIL, 0.1), (Fate.CANCEL, 0.2), (Fate.EXPIRE, 0.2)):
        assert abs(drawn[fate] / 20_000 - share) < 0.02, drawn
    assert {plan.quantity(rng) for _ in range(1_000)} == {1, 2}


def test_percentile_is_the_nearest_rank() -> None:
    ms = [float(n) for n in range(1, 101)]
    assert (percentile(ms, 0.5), percentile(ms, 0.99), percentile(ms, 1.0)) == (50, 99, 100)
    assert percentile([], 0.5) == 0


def test_the_summary_counts_every_request_once() -> None:
    log = CrowdLog(started=0.0)
    samples = [(0.01 * n, "buy", "sold_out" if n % 3 else "reserved", 0.05 * n) for n in range(900)]
    log.samples = samples
    log.crowd_s = 9.0
    log.buyers_sent = 450
    result = summarize(
        kind="bench", target="http://x", started_at=datetime.now(UTC), plan=CrowdPlan(),
        item_id=1, log=log, elapsed_s=10.0, checks=[Check("c", True, "")],
    )  # fmt: skip
    assert result["requests"] == 900 and result["throughput_rps"] == 100.0
    assert result["buyers"] == 450 and result["buyers_per_s"] == 50.0
    assert sum(r["count"] for r in result["outcomes"]) == 900
    histogram = result["latency_histogram"]
    assert len(histogram["edges_ms"]) == len(EDGES_MS)
    assert sum(sum(s["counts"]) for s in histogram["series"]) == 900
    timeline = result["timeline"]
    assert sum(r * timeline["interval_s"] for r in timeline["requests_per_s"]) == pytest.approx(900)
    reserved = next(r for r in result["outcomes"] if r["outcome"] == "reserved")
    assert reserved["count"] == 300 and reserved["p50_ms"] <= reserved["p99_ms"]
