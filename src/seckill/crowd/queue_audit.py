"""The verdict on the crowd's time in a waiting room.

Measured once (``measure_queue``) from what each buyer was told (``QueueVisit``) and the inlet's
own record of its steps (the admin queue route), then judged (``queue_verdicts``): positions let
in in their order and no ticket before its turn; the pre-start joiners' places unrelated to when
they came; one place per buyer and no place twice or missing; nobody still waiting at the end;
and sold out told to every waiting buyer within a bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from seckill.crowd.client import ApiClient
from seckill.crowd.crowd import CrowdLog, QueueVisit
from seckill.crowd.fairness import admission_times, inversions, rank_correlation, unrelated_bound
from seckill.crowd.plan import QueuePlan
from seckill.crowd.result import WaitingRoomOut
from seckill.crowd.waiting import POLL_MAX_S
from seckill.domain.queue import QueueState
from seckill.engine.audit import Check

MIN_DRAWN = 30  # pre-start joiners needed before a rank correlation says anything
ANSWER_MARGIN_S = 1.0  # for an answer to reach a crowd whose event loop is busy polling
_SHOWN = 3  # examples named in a detail


@dataclass(frozen=True, slots=True)
class InletStep:
    t: float  # seconds in the crowd's log
    upto: int


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRecord:
    """The inlet's record of the item's queue (the admin queue route), in the crowd's time."""

    answered: bool  # False: the route did not answer; every figure below is empty
    length: int = 0
    admitted_up_to: int = 0
    steps: tuple[InletStep, ...] = ()


async def read_queue_record(client: ApiClient, item_id: int, log: CrowdLog) -> QueueRecord:
    answer = await client.queue_report(item_id)
    if answer.status != 200:
        return QueueRecord(answered=False)
    body = answer.body
    steps = tuple(
        InletStep(log.since_start(datetime.fromisoformat(step["at"]).timestamp()), step["upto"])
        for step in body["admissions"]
    )
    return QueueRecord(
        answered=True,
        length=int(body["length"]),
        admitted_up_to=int(body["admitted_up_to"]),
        steps=steps,
    )


def propagation_bound_s(front_s: float, poll_gap_s: float) -> float:
    """How long after the first answer that read sold out the last waiting buyer may read it.

    A buyer's answer that still read waiting was made from a front read before the sale sold
    out, so no later than ``front_s`` after it, and so after the first answer that read sold out
    by at most ``front_s`` plus its way back to the crowd (``ANSWER_MARGIN_S``); the buyer's
    next answer came ``poll_gap_s`` after that at most: the longest gap between two answers of
    one buyer, a pause of at most ``POLL_MAX_S`` plus the time the poll waited behind the rest
    of the crowd's (a crowd of thousands on a small machine polls slower than it pauses)."""
    return front_s + poll_gap_s + ANSWER_MARGIN_S


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFigures:
    """Every figure the waiting room's verdicts judge and the result reports."""

    record: QueueRecord
    start_s: float  # the sale's start, in the log's time
    joined: int
    joined_before_start: int
    admitted: int  # buyers whose position the inlet reached
    out_of_order: int  # inversions of the time each position was let in, by position
    early_tickets: tuple[str, ...]  # buyers who asked for their ticket before their turn
    clock_tolerance_s: float
    drawn: int  # pre-start joiners with a drawn position
    rho: float | None  # arrival order against drawn position (None: fewer than MIN_DRAWN)
    held_twice: tuple[int, ...]
    missing: tuple[int, ...]  # positions in 1..length no buyer holds
    outside: tuple[int, ...]  # positions held beyond 1..length
    unplaced: tuple[str, ...]  # buyers never told a position
    told_two: tuple[str, ...]  # buyers told two different positions
    joined_twice: int
    last_states: dict[str, int]
    first_sold_out_s: float | None  # the first answer that read sold_out
    sold_out_readers: int  # waiting buyers who then read it
    propagation_s: float | None  # from the first to the last of them
    poll_gap_s: float  # the longest gap between a reader's answer and their sold_out one
    front_s: float  # how old an answer may be (the deployment's front seconds)
    tickets: tuple[tuple[float, int], ...]  # (asked at, position), by time


def measure_queue(
    visits: Sequence[QueueVisit], record: QueueRecord, *, queue: QueuePlan, start_s: float
) -> QueueFigures:
    placed = sorted((v for v in visits if v.position is not None), key=_position)
    steps = [(step.t, step.upto) for step in record.steps]
    let_in = admission_times(steps, [_position(v) for v in placed])
    tolerance = queue.clock_tolerance_s
    early = [v.buyer for v in visits if v.ticket_asked_at is not None and v.position is None]
    early += [
        v.buyer
        for v, at in zip(placed, let_in, strict=True)
        if v.ticket_asked_at is not None and (at is None or v.ticket_asked_at < at - tolerance)
    ]
    drawn = sorted((v for v in placed if v.before_start), key=lambda v: v.joined_at)
    rho = None
    if len(drawn) >= MIN_DRAWN:
        rho = rank_correlation([v.joined_at for v in drawn], [_position(v) for v in drawn])
    held = Counter(_position(v) for v in placed)
    everyone = range(1, record.length + 1)
    first_sold_out, readers = _sold_out_readers(visits)
    read_at = [v.seen_sold_out_at for v in readers if v.seen_sold_out_at is not None]
    gaps = [v.sold_out_gap_s for v in readers if v.sold_out_gap_s is not None]
    return QueueFigures(
        record=record,
        start_s=start_s,
        joined=len(visits),
        joined_before_start=sum(1 for v in visits if v.before_start),
        admitted=sum(1 for at in let_in if at is not None),
        out_of_order=inversions([at for at in let_in if at is not None]),
        early_tickets=tuple(early),
        clock_tolerance_s=tolerance,
        drawn=len(drawn),
        rho=rho,
        held_twice=tuple(sorted(p for p, n in held.items() if n > 1)),
        missing=tuple(p for p in everyone if p not in held),
        outside=tuple(sorted(p for p in held if p not in everyone)),
        unplaced=tuple(v.buyer for v in visits if v.position is None),
        told_two=tuple(v.buyer for v in visits if len(v.positions) > 1),
        joined_twice=sum(1 for v in visits if v.joins > 1),
        last_states=dict(sorted(Counter(v.state for v in visits).items())),
        first_sold_out_s=first_sold_out,
        sold_out_readers=len(readers),
        propagation_s=None if first_sold_out is None else max(read_at) - first_sold_out,
        poll_gap_s=max(gaps, default=POLL_MAX_S),
        front_s=queue.front_s,
        tickets=tuple(
            sorted(
                (v.ticket_asked_at, _position(v)) for v in placed if v.ticket_asked_at is not None
            )
        ),
    )


def _position(visit: QueueVisit) -> int:
    return visit.position or 0


def _sold_out_readers(visits: Sequence[QueueVisit]) -> tuple[float | None, list[QueueVisit]]:
    """The first answer that read sold_out, and the buyers who were in the queue by then and
    read it (the first one's reader among them)."""
    read = [v.seen_sold_out_at for v in visits if v.seen_sold_out_at is not None]
    if not read:
        return None, []
    first = min(read)
    return first, [v for v in visits if v.seen_sold_out_at is not None and v.joined_at <= first]


def queue_verdicts(figures: QueueFigures) -> list[Check]:
    return [
        _in_position_order(figures),
        _drawn_at_random(figures),
        _positions_contiguous(figures),
        _nobody_left_waiting(figures),
        _sold_out_reached_everyone(figures),
    ]


def _in_position_order(f: QueueFigures) -> Check:
    ok = f.record.answered and f.out_of_order == 0 and not f.early_tickets
    clock = (
        f"clocks {f.clock_tolerance_s:g} s apart allowed" if f.clock_tolerance_s else "one clock"
    )
    detail = (
        f"{f.admitted:,} positions let in over {len(f.record.steps):,} steps, "
        f"{f.out_of_order:,} out of order; {len(f.early_tickets):,} tickets before their "
        f"buyer's turn ({clock})"
    )
    if f.early_tickets:
        detail += ": " + ", ".join(f.early_tickets[:_SHOWN])
    if not f.record.answered:
        detail = "the admin queue route did not answer"
    return Check("admitted in position order", ok, detail)


def _drawn_at_random(f: QueueFigures) -> Check:
    name = "pre-start joiners in random order"
    if f.rho is None:
        return Check(name, True, f"too few to judge: {f.drawn} drawn ({MIN_DRAWN} needed)")
    bound = unrelated_bound(f.drawn)
    detail = (
        f"rank correlation of arrival and drawn position {f.rho:+.3f} over {f.drawn:,} "
        f"pre-start joiners (unrelated: |rho| < {bound:.3f})"
    )
    return Check(name, abs(f.rho) < bound, detail)


def _positions_contiguous(f: QueueFigures) -> Check:
    problems = [
        (f.held_twice, "held twice"),
        (f.missing, "held by nobody"),
        (f.outside, f"beyond {f.record.length:,}"),
        (f.told_two, "buyers told two positions"),
        (f.unplaced, "buyers never told a position"),
    ]
    found = [
        f"{len(items):,} {what} ({', '.join(map(str, items[:_SHOWN]))})"
        for items, what in problems
        if items
    ]
    placed = f.joined - len(f.unplaced)
    detail = (
        f"{placed:,} buyers hold positions 1..{f.record.length:,}; {f.joined_twice:,} joined twice"
    )
    if found:
        detail += "; " + "; ".join(found)
    if not f.record.answered:
        detail = "the admin queue route did not answer"
    ok = f.record.answered and not found
    return Check("positions unique and contiguous", ok, detail)


def _nobody_left_waiting(f: QueueFigures) -> Check:
    waiting = f.last_states.get(QueueState.WAITING, 0)
    shown = ", ".join(f"{state} {n:,}" for state, n in f.last_states.items()) or "nobody joined"
    return Check("nobody left waiting", waiting == 0, f"last states: {shown}")


def _sold_out_reached_everyone(f: QueueFigures) -> Check:
    name = "sold out reached everyone"
    if f.propagation_s is None:
        return Check(name, True, "nobody read sold_out: the item did not sell out to the queue")
    bound = propagation_bound_s(f.front_s, f.poll_gap_s)
    detail = (
        f"{f.sold_out_readers:,} waiting buyers read sold_out within {f.propagation_s:.2f} s "
        f"of the first (bound {bound:.2f} s: answers {f.front_s:g} s old + polls up to "
        f"{f.poll_gap_s:.2f} s apart + {ANSWER_MARGIN_S:g} s)"
    )
    return Check(name, f.propagation_s <= bound, detail)


def queue_out(f: QueueFigures) -> WaitingRoomOut:
    """The figures as the crowd's result reports them."""
    steps = f.record.steps
    return WaitingRoomOut(
        start_s=round(f.start_s, 3),
        joined=f.joined,
        joined_before_start=f.joined_before_start,
        length=f.record.length,
        admitted_up_to=f.record.admitted_up_to,
        out_of_order=f.out_of_order,
        tickets_before_turn=len(f.early_tickets),
        clock_tolerance_s=f.clock_tolerance_s,
        drawn=f.drawn,
        rank_correlation=None if f.rho is None else round(f.rho, 4),
        unrelated_bound=None if f.rho is None else round(unrelated_bound(f.drawn), 4),
        positions_held_twice=len(f.held_twice),
        positions_missing=len(f.missing) + len(f.outside),
        buyers_told_two_positions=len(f.told_two),
        joined_twice=f.joined_twice,
        left_waiting=f.last_states.get(QueueState.WAITING, 0),
        last_states=f.last_states,
        sold_out_propagation_s=None if f.propagation_s is None else round(f.propagation_s, 3),
        poll_gap_s=round(f.poll_gap_s, 3),
        propagation_bound_s=round(propagation_bound_s(f.front_s, f.poll_gap_s), 3),
        admissions={"t_s": [round(s.t, 3) for s in steps], "upto": [s.upto for s in steps]},
        tickets={
            "t_s": [round(t, 3) for t, _ in f.tickets],
            "position": [p for _, p in f.tickets],
        },
    )
