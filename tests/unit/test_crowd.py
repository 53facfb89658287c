"""The crowd's plan, how its log is summed up, and the waiting room's verdicts: pure logic, no
servers."""

from __future__ import annotations

import random
import re
from collections import Counter
from datetime import UTC, datetime

import pytest

from seckill.crowd.crowd import CrowdLog, QueueVisit
from seckill.crowd.plan import CrowdPlan, Fate, QueuePlan
from seckill.crowd.queue_audit import (
    InletStep,
    QueueRecord,
    measure_queue,
    queue_out,
    queue_verdicts,
)
from seckill.crowd.summary import EDGES_MS, percentile, summarize
from seckill.crowd.waiting import POLL_MAX_S, POLL_MIN_S, pause_s
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


# The waiting room's verdicts, fed a made-up queue: 40 buyers joined before the start (places
# drawn at random), 10 after (first come, first served); the inlet let 30 in over three steps;
# the rest read sold_out at the end, a second after their previous answer.
STEPS = (InletStep(5.0, 10), InletStep(6.0, 20), InletStep(7.0, 30))
FRONT_S = 0.5


def queue_visits() -> list[QueueVisit]:
    rng = random.Random(11)
    drawn = rng.sample(range(1, 41), 40)
    visits = []
    for n in range(50):
        position = drawn[n] if n < 40 else n + 1
        visit = QueueVisit(
            buyer=f"b{n}", wave=1 if n < 40 else 2, joined_at=0.01 * n, before_start=n < 40
        )
        visit.positions.append(position)
        if position <= 30:
            let_in = STEPS[(position - 1) // 10].t
            visit.seen_admitted_at, visit.ticket_asked_at = let_in + 0.2, let_in + 0.25
            visit.state = "admitted"
        else:
            visit.seen_sold_out_at, visit.sold_out_gap_s = 8.0 + 0.02 * (position - 30), 1.0
            visit.state = "sold_out"
        visits.append(visit)
    visits[0].joins = 2  # joined again, and was told the same place
    return visits


def judged(
    visits: list[QueueVisit], *, steps: tuple[InletStep, ...] = STEPS, tolerance_s: float = 0.0
) -> dict[str, Check]:
    record = QueueRecord(answered=True, length=50, admitted_up_to=30, steps=steps)
    plan = QueuePlan(front_s=FRONT_S, clock_tolerance_s=tolerance_s)
    figures = measure_queue(visits, record, queue=plan, start_s=3.0)
    return {check.name: check for check in queue_verdicts(figures)}


def failed(checks: dict[str, Check]) -> set[str]:
    return {name for name, check in checks.items() if not check.ok}


def test_a_fair_queue_passes_every_waiting_room_verdict() -> None:
    checks = judged(queue_visits())
    assert not failed(checks), checks
    assert list(checks) == [
        "admitted in position order",
        "pre-start joiners in random order",
        "positions unique and contiguous",
        "nobody left waiting",
        "sold out reached everyone",
    ]
    assert (
        "30 positions let in over 3 steps, 0 out of order; 0 tickets"
        in checks["admitted in position order"].detail
    )
    assert "over 40 pre-start joiners" in checks["pre-start joiners in random order"].detail
    assert (
        "50 buyers hold positions 1..50; 1 joined twice"
        in checks["positions unique and contiguous"].detail
    )
    assert checks["nobody left waiting"].detail == "last states: admitted 30, sold_out 20"
    # 20 readers, from 8.02 s to 8.40 s; polls 1 s apart: the bound is 0.5 + 1 + 1 s.
    spread = checks["sold out reached everyone"].detail
    assert "20 waiting buyers read sold_out within 0.38 s of the first (bound 2.50 s" in spread


def test_a_ticket_before_its_turn_fails_unless_the_clocks_may_differ_that_much() -> None:
    visits = queue_visits()
    early = next(v for v in visits if v.position == 25)  # let in at 7.0 s
    early.ticket_asked_at = 6.5
    checks = judged(visits)
    assert failed(checks) == {"admitted in position order"}
    assert (
        f"1 tickets before their buyer's turn (one clock): {early.buyer}"
        in checks["admitted in position order"].detail
    )
    lenient = judged(visits, tolerance_s=1.0)
    assert not failed(lenient)
    assert "clocks 1 s apart allowed" in lenient["admitted in position order"].detail
    # A ticket for a place the inlet never reached is before its turn whatever the clocks.
    never = next(v for v in visits if v.position == 45)
    never.ticket_asked_at = 9.0
    assert "admitted in position order" in failed(judged(visits, tolerance_s=1.0))


def test_steps_whose_times_run_backwards_let_positions_in_out_of_order() -> None:
    backwards = (InletStep(5.0, 10), InletStep(4.0, 20), InletStep(7.0, 30))
    checks = judged(queue_visits(), steps=backwards)
    assert failed(checks) == {"admitted in position order"}
    # Each of 1..10 (let in at 5.0 s) before each of 11..20 (at 4.0 s): 100 pairs.
    assert "100 out of order; 0 tickets" in checks["admitted in position order"].detail


def test_places_that_follow_arrival_are_not_a_random_draw() -> None:
    visits = queue_visits()
    for n, visit in enumerate(visits[:40]):
        visit.positions[:] = [n + 1]  # the draw kept the arrival order
    checks = judged(visits)
    assert "pre-start joiners in random order" in failed(checks)
    assert "+1.000 over 40 pre-start joiners" in checks["pre-start joiners in random order"].detail


def test_too_few_pre_start_joiners_pass_as_too_few_to_judge() -> None:
    visits = queue_visits()
    for visit in visits[12:40]:
        visit.before_start = False
    check = judged(visits)["pre-start joiners in random order"]
    assert check.ok and check.detail == "too few to judge: 12 drawn (30 needed)"


def test_a_place_held_twice_missing_or_changed_is_named() -> None:
    visits = queue_visits()
    twin = next(v for v in visits if v.position == 50)
    twin.positions[:] = [49]  # 49 held twice, 50 by nobody
    moved = next(v for v in visits if v.position == 41)
    moved.positions.append(48)  # told 41, then 48 (48 held twice too)
    detail = judged(visits)["positions unique and contiguous"].detail
    assert "2 held twice (48, 49)" in detail
    assert "2 held by nobody (41, 50)" in detail
    assert f"1 buyers told two positions ({moved.buyer})" in detail


def test_a_buyer_still_waiting_at_the_end_fails() -> None:
    visits = queue_visits()
    stuck = next(v for v in visits if v.state == "sold_out")
    stuck.state, stuck.seen_sold_out_at, stuck.sold_out_gap_s = "waiting", None, None
    checks = judged(visits)
    assert failed(checks) == {"nobody left waiting"}
    assert "waiting 1" in checks["nobody left waiting"].detail


def test_sold_out_reaching_a_buyer_late_fails_the_bound() -> None:
    visits = queue_visits()
    late = next(v for v in visits if v.state == "sold_out")
    late.seen_sold_out_at = 8.0 + 4.0  # polls a second apart: 2.5 s is the bound
    checks = judged(visits)
    assert failed(checks) == {"sold out reached everyone"}
    assert "within 3.98 s of the first (bound 2.50 s" in checks["sold out reached everyone"].detail
    # A buyer who joined after sold out was first read is told at once: not a waiting reader.
    newcomer = QueueVisit(buyer="late", wave=2, joined_at=20.0, before_start=False)
    newcomer.positions.append(51)
    newcomer.seen_sold_out_at, newcomer.state = 20.0, "sold_out"
    assert (
        "20 waiting buyers"
        in judged([*queue_visits(), newcomer])["sold out reached everyone"].detail
    )


def test_no_sale_to_the_queue_passes_with_nothing_to_judge() -> None:
    visits = [v for v in queue_visits() if v.state == "admitted"]
    check = judged(visits)["sold out reached everyone"]
    assert check.ok and "nobody read sold_out" in check.detail


@pytest.mark.parametrize(
    ("estimated_wait_s", "stretch", "pause"),
    [(None, 1.0, 1.0), (0, 1.0, 0.5), (1, 1.2, 1.2), (30, 0.8, 2.0), (None, 0.4, 0.5)],
)
def test_a_waiting_buyer_polls_between_half_a_second_and_two(
    estimated_wait_s: int | None, stretch: float, pause: float
) -> None:
    assert pause_s(estimated_wait_s, stretch) == pytest.approx(pause)
    assert POLL_MIN_S <= pause_s(estimated_wait_s, stretch) <= POLL_MAX_S


def test_the_summary_carries_the_waiting_room_only_when_there_was_one() -> None:
    visits = queue_visits()
    record = QueueRecord(answered=True, length=50, admitted_up_to=30, steps=STEPS)
    figures = measure_queue(visits, record, queue=QueuePlan(front_s=FRONT_S), start_s=3.0)
    room = queue_out(figures)
    common = {
        "kind": "demo", "target": "http://x", "started_at": datetime.now(UTC), "plan": CrowdPlan(),
        "item_id": 1, "log": CrowdLog(started=0.0), "elapsed_s": 1.0, "checks": [],
    }  # fmt: skip
    assert "waiting_room" not in summarize(**common)  # type: ignore[arg-type]
    result = summarize(**common, waiting_room=room)  # type: ignore[arg-type]
    assert result["waiting_room"] == room
    assert room["joined"] == 50 and room["joined_before_start"] == 40 and room["drawn"] == 40
    assert room["length"] == 50 and room["left_waiting"] == 0
    assert room["admissions"] == {"t_s": [5.0, 6.0, 7.0], "upto": [10, 20, 30]}
    assert len(room["tickets"]["t_s"]) == 30 and room["tickets"]["t_s"] == sorted(
        room["tickets"]["t_s"]
    )
    assert room["propagation_bound_s"] == 2.5 and room["poll_gap_s"] == 1.0
