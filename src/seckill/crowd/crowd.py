"""The crowd itself: buyers over HTTP in two waves, every request recorded.

A buyer asks for a purchase ticket, buys with an idempotency key (some send it twice, as a
double click does), and then pays, has the payment fail, cancels, or lets the hold run out
(``plan.Fate``). Some who pay are charged twice by their provider: the second charge must be
owed back. A request that gets no answer is sent again with the same key or payment id,
as a careful client does; those are safe to repeat. Once per sale (``plan.stray_charges``) the
provider also charges one order a cent short before its right payment, and charges for an order
never issued: both must be refunds owed. Once the first crowd's holds have run out,
a late crowd buys (and pays for) the units that came back. Through a waiting room
(``seckill.crowd.waiting``) each buyer queues first and buys the same way once let in.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from seckill.crowd.client import TRANSPORT_ERROR, ApiClient, Reply
from seckill.crowd.plan import CrowdPlan, Fate
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus

RESERVED = "reserved"
_ACCEPTED = frozenset({OrderStatus.PAID, OrderStatus.REFUND_REQUIRED})  # a charge's answers
_ATTEMPTS = 3  # sends of one idempotent request that got no answer
# An order id no deployment issues: ids count milliseconds from ``domain.ids.EPOCH_MS``, and
# this one is of its very first (2024-01-01), before any deployment's first order.
NEVER_ISSUED = "1"


@dataclass(frozen=True, slots=True)
class BuyerSpec:
    name: str
    quantity: int
    replay: bool
    fate: Fate
    wave: int
    charged_twice: bool = False  # pays, and the provider charges a second time


@dataclass(frozen=True, slots=True)
class CrowdCharge:
    """A successful charge the provider made, and the callback's first answer to its notice:
    a sale or a refund owed; anything else (a refusal, no answer) leaves it unaccounted."""

    order_id: str
    payment_id: str
    amount: Money  # the sum charged
    outcome: str  # paid, refund_required; else the refusal
    reason: str | None  # a refund's


@dataclass(slots=True, kw_only=True)
class CrowdOrder:
    """An order a buyer was told it holds, and what the crowd was last told of its status."""

    order_id: str
    buyer: str
    key: str
    quantity: int
    cost: Money  # the item's price times the quantity: the sum that pays it
    fate: Fate
    wave: int
    status: str = OrderStatus.HELD
    release_reason: str | None = None


@dataclass(slots=True, kw_only=True)
class QueueVisit:
    """A buyer's time in the waiting room, as the crowd was told it. Times are the log's."""

    buyer: str
    wave: int
    joined_at: float  # the join's answer arrived
    before_start: bool  # the join answered no position: the draw at the start places them
    positions: list[int] = field(default_factory=list)  # every distinct one answered, in order
    joins: int = 1  # the replay share joins twice: the same position must come back
    seen_admitted_at: float | None = None  # the first answer that read admitted
    ticket_asked_at: float | None = None  # the request that was issued a ticket was sent
    seen_sold_out_at: float | None = None  # the first answer that read sold_out
    sold_out_gap_s: float | None = None  # from the answer before that one to it
    answered_at: float = 0.0  # the last answer
    state: str = "waiting"  # what the last answer read

    @property
    def position(self) -> int | None:
        return self.positions[-1] if self.positions else None


@dataclass(frozen=True, slots=True)
class StockPoint:
    t: float
    available: int
    held: int
    sold: int
    backlog: int


@dataclass(slots=True)
class CrowdLog:
    """Everything the crowd sent and was told. Times are seconds since ``started``."""

    started: float = field(default_factory=time.perf_counter)
    # The same moment on the wall clock, to read the server's timestamps in the log's time.
    wall_started: float = field(default_factory=time.time)
    samples: list[tuple[float, str, str, float]] = field(default_factory=list)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (action, outcome)
    orders: dict[str, CrowdOrder] = field(default_factory=dict)
    replays: int = 0
    replays_differing: list[str] = field(default_factory=list)
    charges: dict[str, CrowdCharge] = field(default_factory=dict)  # successes, by payment id
    stock: list[StockPoint] = field(default_factory=list)
    phase: str = "starting"
    crowd_s: float = 0.0  # wall time spent in the waves
    buyers_sent: int = 0
    visits: dict[str, QueueVisit] = field(default_factory=dict)  # buyer -> their waiting room
    admitted_up_to_seen: int = 0  # the furthest frontier a waiting room's answer showed

    def now(self) -> float:
        return time.perf_counter() - self.started

    def since_start(self, wall: float) -> float:
        """A wall-clock time (Unix seconds) in the log's time."""
        return wall - self.wall_started

    def record(self, action: str, reply: Reply, *, accepted: str | None = None) -> Reply:
        outcome = accepted if accepted is not None and reply.status < 300 else reply.outcome
        self.samples.append((self.now() - reply.ms / 1000, action, outcome, reply.ms))
        self.counts[action, outcome] += 1
        return reply


class Crowd:
    def __init__(
        self, client: ApiClient, item_id: int, plan: CrowdPlan, log: CrowdLog, *, price: Money
    ) -> None:
        self.client = client
        self.item_id = item_id
        self.plan = plan
        self.log = log
        self.price = price  # the item's, as its creation answered
        self.rng = random.Random(plan.seed)
        self.strays_due = plan.stray_charges

    def first_wave(self) -> Iterator[BuyerSpec]:
        for n in range(self.plan.buyers):
            yield self._spec(f"buyer-{n}", wave=1, fate=self.plan.fate(self.rng))

    def late_wave(self) -> Iterator[BuyerSpec]:
        for n in range(self.plan.late_crowd):
            yield self._spec(f"late-{n}", wave=2, fate=Fate.PAY)

    def _spec(self, name: str, *, wave: int, fate: Fate) -> BuyerSpec:
        replay = self.rng.random() < self.plan.replay
        twice = fate is Fate.PAY and self.rng.random() < self.plan.double_charge
        return BuyerSpec(name, self.plan.quantity(self.rng), replay, fate, wave, twice)

    async def run_wave(self, buyers: Iterator[BuyerSpec], *, duration_s: float | None) -> None:
        """Send ``buyers`` through, ``plan.concurrency`` at a time; none starts after
        ``duration_s``."""
        started = time.perf_counter()
        await self.lanes(buyers, self.buyer, duration_s=duration_s)
        self.log.crowd_s += time.perf_counter() - started

    async def lanes(
        self,
        buyers: Iterator[BuyerSpec],
        journey: Callable[[BuyerSpec], Awaitable[None]],
        *,
        duration_s: float | None,
    ) -> None:
        """``journey`` for each of ``buyers``, ``plan.concurrency`` at a time; none starts after
        ``duration_s``."""
        deadline = None if duration_s is None else time.perf_counter() + duration_s

        async def lane() -> None:
            for spec in buyers:  # one iterator shared by every lane
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                self.log.buyers_sent += 1
                await journey(spec)

        await asyncio.gather(*(lane() for _ in range(self.plan.concurrency)))

    async def buyer(self, spec: BuyerSpec) -> None:
        issued = await self.ask_ticket(spec)
        if issued.status == 200:
            await self.purchase(spec, str(issued.body["ticket"]))

    async def ask_ticket(self, spec: BuyerSpec) -> Reply:
        client, item = self.client, self.item_id
        return await self.send("ticket", lambda: client.ticket(item, spec.name), accepted="issued")

    async def purchase(self, spec: BuyerSpec, ticket: str) -> None:
        """Buy with ``ticket`` (twice with one key for the replay share), then meet the fate."""
        log, client, item = self.log, self.client, self.item_id
        key = f"{spec.name}-click"

        async def buy() -> Reply:
            return await client.buy(item, spec.name, ticket=ticket, key=key, quantity=spec.quantity)

        held = await self.send("buy", buy, accepted=RESERVED)
        if spec.replay:  # a double click: the same key again must change nothing
            again = await self.send("replay", buy, accepted=RESERVED)
            if held.status == 202:
                log.replays += 1
                if again.status != 202 or again.body.get("order_id") != held.body["order_id"]:
                    log.replays_differing.append(f"{spec.name}: {again.outcome}")
            else:  # a refusal had no effect and is decided afresh: units may have come back
                held = again
        if held.status != 202:
            return
        order = CrowdOrder(
            order_id=str(held.body["order_id"]),
            buyer=spec.name,
            key=key,
            quantity=spec.quantity,
            cost=self.price.times(spec.quantity),
            fate=spec.fate,
            wave=spec.wave,
        )
        log.orders[order.order_id] = order
        await self._settle(order, repeat_notice=spec.replay)
        if spec.charged_twice and order.status == OrderStatus.PAID:
            await self._charge_again(order, repeat_notice=spec.replay)

    async def _charge_again(self, order: CrowdOrder, *, repeat_notice: bool) -> None:
        """The provider charged the buyer a second time: its notice must be a refund owed."""
        for _ in range(1 + repeat_notice):
            await self.charge("charge again", order.order_id, f"again-{order.order_id}", order.cost)

    async def _stray_charges(self, order: CrowdOrder) -> None:
        """A charge a cent short of the held ``order``'s sum (a cent over a free one), and a
        charge for an order never issued: each must be a refund owed of the sum charged, the
        order still held (the learned status says so; its right payment follows)."""
        cents = order.cost.cents - 1 if order.cost.cents else 1
        short = await self.charge(
            "charge wrong sum", order.order_id, f"short-{order.order_id}",
            Money(cents, order.cost.currency),
        )  # fmt: skip
        self._learn(order, short, status="order_status", reason=None)
        await self.charge("charge unknown order", NEVER_ISSUED, f"stray-{self.item_id}", self.price)

    async def charge(self, action: str, order_id: str, payment_id: str, amount: Money) -> Reply:
        """A success notice for a charge of ``amount``; its first answer is kept (a sale, a
        refund owed, or what left the charge unaccounted)."""
        client, item = self.client, self.item_id

        async def notify() -> Reply:
            return await client.notify_payment(
                item, order_id, payment_id=payment_id, succeeded=True, amount=amount
            )

        answer = await self.send(action, notify)
        self._charged(order_id, payment_id, amount, answer)
        return answer

    def _charged(self, order_id: str, payment_id: str, amount: Money, answer: Reply) -> None:
        """Keep a charge's first accepted answer (200: a sale or a refund owed), or else what it
        was told, until a retry is accepted."""
        kept = self.log.charges.get(payment_id)
        if kept is None or kept.outcome not in _ACCEPTED:
            said = answer.body.get("outcome") if answer.status == 200 else None
            self.log.charges[payment_id] = CrowdCharge(
                order_id, payment_id, amount, str(said or answer.outcome),
                answer.body.get("refund_reason"),
            )  # fmt: skip

    async def _settle(self, order: CrowdOrder, *, repeat_notice: bool) -> None:
        client, item, oid = self.client, self.item_id, order.order_id
        if order.fate is Fate.EXPIRE:
            order.status, order.release_reason = OrderStatus.RELEASED, "expired"
            return
        if order.fate is Fate.CANCEL:
            answer = await self.send("cancel", lambda: client.cancel(order.buyer, item, oid))
            self._learn(order, answer, status="status", reason=answer.body.get("release_reason"))
            return
        succeeded = order.fate is Fate.PAY
        if succeeded and self.strays_due:
            self.strays_due = False  # before the await: the first payer of the sale only
            await self._stray_charges(order)
        action = "pay" if succeeded else "fail"
        payment_id = f"{action}-{oid}"

        async def fail() -> Reply:
            return await client.notify_payment(
                item, oid, payment_id=payment_id, succeeded=False, amount=order.cost
            )

        # Providers repeat notices: the same one again has no new effect.
        answers = []
        for _ in range(1 + repeat_notice):
            if succeeded:
                answers.append(await self.charge(action, oid, payment_id, order.cost))
            else:
                answers.append(await self.send(action, fail))
        for answer in answers:
            # A failure that released the hold says why; one that found it released does not.
            reason = "payment_failed" if answer.body.get("outcome") == "released" else None
            self._learn(order, answer, status="order_status", reason=reason)

    @staticmethod
    def _learn(order: CrowdOrder, answer: Reply, *, status: str, reason: str | None) -> None:
        if answer.status == 200:
            order.status, order.release_reason = str(answer.body[status]), reason

    async def send(self, action: str, call: Any, *, accepted: str | None = None) -> Reply:
        """``call`` until it gets an HTTP answer (at most ``_ATTEMPTS`` sends), each recorded."""
        for _ in range(_ATTEMPTS):
            answer: Reply = self.log.record(action, await call(), accepted=accepted)
            if answer.outcome != TRANSPORT_ERROR:
                break
        return answer


class StockWatch:
    """Polls the item's counters (the admin API) while the crowd runs: for the live view, the
    report's stock chart, and to know when holds have run out or the stream has landed."""

    def __init__(self, client: ApiClient, item_id: int, log: CrowdLog, *, every_s: float) -> None:
        self.client = client
        self.item_id = item_id
        self.log = log
        self.every_s = every_s
        self.latest: dict[str, Any] | None = None

    async def look(self) -> dict[str, Any] | None:
        answer = await self.client.counters(self.item_id)
        if answer.status != 200 or answer.body.get("redis") is None:
            return None
        self.latest = answer.body
        redis = answer.body["redis"]
        self.log.stock.append(
            StockPoint(
                self.log.now(), redis["available"], redis["held"], redis["sold"],
                answer.body["backlog"],
            )
        )  # fmt: skip
        return answer.body

    async def run(self) -> None:
        while True:
            await self.look()
            await asyncio.sleep(self.every_s)

    async def until(self, settled: Any, *, timeout_s: float, what: str) -> dict[str, Any]:
        """Look until ``settled(counters)``; ``TimeoutError`` naming ``what`` after
        ``timeout_s``."""
        give_up = time.perf_counter() + timeout_s
        while True:
            seen = await self.look()
            if seen is not None and settled(seen):
                return seen
            if time.perf_counter() >= give_up:
                raise TimeoutError(f"{what}: not within {timeout_s:.0f} s (last seen: {seen})")
            await asyncio.sleep(self.every_s)


@contextlib.asynccontextmanager
async def watching(watch: StockWatch) -> Any:
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
