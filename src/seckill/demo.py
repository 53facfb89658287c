"""A scripted flash sale on the engine, ending in a verdict table.

The item is created in SQL and warmed into Redis. A crowd rushes it; some buyers pay, some
cancel, some let the hold run out, some retry with the same idempotency key; then a second crowd
buys what came back. The verdicts are the invariants of DESIGN.md, checked on what Redis holds,
and then on SQL once the persister has landed the item's stream.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from seckill.bootstrap import Runtime
from seckill.domain.holds import ReleaseReason, Reservation
from seckill.domain.outcomes import Outcome
from seckill.engine.audit import Check, audit_item
from seckill.reconcile.records import compare_records
from seckill.services.items import warm_item
from seckill.store.ledger import NewItem
from seckill.workers.persister import Persister, PersisterConfig, stream_drained

DRAIN_LIMIT_S = 120


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPlan:
    buyers: int = 2_000
    units: int = 100
    per_buyer_limit: int = 2
    hold_seconds: int = 2
    pay_share: float = 0.5
    cancel_share: float = 0.25  # the rest let their hold expire
    replay_share: float = 0.1
    seed: int = 7


@dataclass(slots=True)
class DemoReport:
    item_id: int
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    wave_seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def reservations_per_s(self) -> float:
        return len(self.latencies_ms) / self.wave_seconds if self.wave_seconds else 0.0

    def latency_ms(self, q: float) -> float:
        cuts = statistics.quantiles(self.latencies_ms, n=100, method="inclusive")
        return cuts[round(q * 100) - 1]


class _Crowd:
    def __init__(self, runtime: Runtime, item_id: int, report: DemoReport) -> None:
        self.engine = runtime.engine
        self.ids = runtime.order_ids
        self.item_id = item_id
        self.report = report
        self.replays = 0
        self.replays_differing = 0

    async def buy(self, buyer: str, quantity: int, key: str) -> Reservation:
        started = time.perf_counter()
        answer = await self.engine.reserve(
            self.item_id,
            buyer=buyer,
            quantity=quantity,
            idempotency_key=key,
            order_id=self.ids.next(),
        )
        self.report.latencies_ms.append((time.perf_counter() - started) * 1000)
        self.report.outcomes[Outcome.REPLAY if answer.replayed else answer.outcome] += 1
        return answer

    async def buyer(self, name: str, quantity: int, replay: bool) -> tuple[int, Reservation]:
        first = await self.buy(name, quantity, f"{name}-click")
        if replay:  # a buyer double-clicks: the same key again must change nothing
            again = await self.buy(name, quantity, f"{name}-click")
            # A refusal had no effect and is decided afresh (insufficient_stock may become
            # sold_out); a reservation must come back as itself.
            if first.accepted:
                self.replays += 1
                if (again.outcome, again.order_id) != (first.outcome, first.order_id):
                    self.replays_differing += 1
        return quantity, first

    async def wave(
        self, names: list[str], rng: random.Random, replay_share: float
    ) -> list[tuple[int, Reservation]]:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(self.buyer(n, rng.choice((1, 1, 1, 2)), rng.random() < replay_share) for n in names)
        )
        self.report.wave_seconds += time.perf_counter() - started
        return list(answers)


async def run_demo(runtime: Runtime, plan: DemoPlan) -> DemoReport:
    engine = runtime.engine
    rng = random.Random(plan.seed)
    opens = datetime.now(UTC) - timedelta(seconds=1)
    item_id = await runtime.ledger.create_item(
        NewItem(
            name="Demo item",
            price_cents=9_900,
            total=plan.units,
            starts_at=opens,
            ends_at=opens + timedelta(hours=1),
            per_buyer_limit=plan.per_buyer_limit,
            hold_seconds=plan.hold_seconds,
        )
    )
    await warm_item(engine, runtime.ledger, item_id)
    report = DemoReport(item_id)
    crowd = _Crowd(runtime, item_id, report)

    first = await crowd.wave([f"buyer-{n}" for n in range(plan.buyers)], rng, plan.replay_share)
    for _, reservation in first:
        if reservation.order_id is None or reservation.replayed:
            continue
        fate = rng.random()
        if fate < plan.pay_share:
            await engine.confirm(item_id, reservation.order_id)
        elif fate < plan.pay_share + plan.cancel_share:
            await engine.release(item_id, reservation.order_id, ReleaseReason.CANCELLED)

    # Let the unpaid holds run out and reap them, as the reaper worker will.
    await asyncio.sleep(plan.hold_seconds + 0.05)
    while await engine.expire_due(item_id):
        pass
    back_on_sale = await engine.stock(item_id)
    assert back_on_sale is not None

    second = await crowd.wave(
        [f"late-{n}" for n in range(max(plan.buyers // 4, 1))], rng, plan.replay_share
    )
    resold = paid_late = 0
    for quantity, reservation in second:
        if reservation.accepted and reservation.order_id and not reservation.replayed:
            resold += quantity
            # On a loaded machine a late payment can miss its hold: then it is released instead
            # and marked for refund (refund_required), and the unit is not sold.
            paid = await engine.confirm(item_id, reservation.order_id)
            paid_late += quantity if paid.outcome is Outcome.PAID else 0

    final = await engine.stock(item_id)
    assert final is not None
    report.checks = [
        Check(
            "not oversold",
            final.held + final.sold <= final.total,
            f"sold {final.sold} + held {final.held} of {final.total}",
        ),
        *await audit_item(engine, item_id),
        Check(
            "replays identical",
            crowd.replays_differing == 0,
            f"{crowd.replays} reservations repeated, {crowd.replays_differing} differently",
        ),
        Check(
            "released units back on sale",
            back_on_sale.available == back_on_sale.total - back_on_sale.sold
            and back_on_sale.held == 0,
            f"after expiry: available {back_on_sale.available}, sold {back_on_sale.sold}, "
            f"held {back_on_sale.held}",
        ),
        Check(
            "released units resold",
            resold > 0 or back_on_sale.available == 0,
            f"{back_on_sale.available} back on sale, {resold} reserved again",
        ),
        Check(
            "payments counted once",
            final.sold == back_on_sale.sold + paid_late,
            f"sold {back_on_sale.sold} + paid later {paid_late} = {final.sold}",
        ),
    ]
    report.checks += await _land_in_sql(runtime, item_id)
    return report


async def _land_in_sql(runtime: Runtime, item_id: int) -> list[Check]:
    """Run the persister until the item's stream has landed, then compare SQL with Redis."""
    persister = Persister(
        redis=runtime.redis,
        ledger=runtime.ledger,
        prefix=runtime.settings.key_prefix,
        config=PersisterConfig(block_ms=20),
    )
    stream = runtime.engine.keys(item_id).events
    try:
        async with asyncio.timeout(DRAIN_LIMIT_S):
            while not await stream_drained(runtime.redis, stream):
                await persister.run_once()
    except TimeoutError:
        return [Check("landed in SQL", False, f"the stream did not drain in {DRAIN_LIMIT_S} s")]
    landed = Check("landed in SQL", True, f"{persister.landed} events landed in SQL")
    return [landed, *await compare_records(runtime.engine, runtime.ledger, item_id)]
