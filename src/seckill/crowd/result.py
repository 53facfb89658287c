"""The result of a crowd run, as written to ``<name>.json`` and drawn in ``<name>.html``.

One shape for the demo and the bench; every figure a report shows is a field here. Times are
seconds from the first request; latencies are milliseconds.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

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


class QueueSteps(TypedDict):
    t_s: list[float]  # when the inlet took each step
    upto: list[int]  # every position up to this one was let in by then


class TicketTimes(TypedDict):
    t_s: list[float]  # when a buyer let in asked for the ticket they were given
    position: list[int]  # that buyer's position


class WaitingRoomOut(TypedDict):
    """The crowd's time in the waiting room (with ``--waiting-room``)."""

    start_s: float  # the sale's start: the pre-start joiners' places are drawn then
    joined: int  # buyers who joined (both waves)
    joined_before_start: int
    length: int  # positions the server gave (its admin queue route)
    admitted_up_to: int  # the frontier at the end
    out_of_order: int  # pairs of positions let in out of order (inversions)
    tickets_before_turn: int  # tickets asked for before the buyer's position was let in
    clock_tolerance_s: float  # how far the crowd's clock may be from Redis's
    drawn: int  # pre-start joiners with a drawn position
    rank_correlation: float | None  # arrival order against drawn position; None: too few
    unrelated_bound: float | None  # |rank_correlation| below this: unrelated orders
    positions_held_twice: int
    positions_missing: int  # in 1..length but held by no buyer, or beyond length
    buyers_told_two_positions: int
    joined_twice: int  # buyers who joined again (the replay share): the same place came back
    left_waiting: int  # buyers whose last answer still read waiting
    last_states: dict[str, int]  # buyers by the state their last answer read
    sold_out_propagation_s: float | None  # the first sold_out read to the last waiting buyer's
    poll_gap_s: float  # the longest gap between a waiting buyer's answers as sold out came
    propagation_bound_s: float  # front seconds + poll_gap_s + 1 s
    admissions: QueueSteps
    tickets: TicketTimes


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
    waiting_room: NotRequired[WaitingRoomOut]  # only through a waiting room
