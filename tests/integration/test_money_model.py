"""Every charge accounted for, under whatever a payment provider sends: a Hypothesis state machine
over payment notices (successes and failures, reused payment ids, retries, two notices at once,
holds running out, and archiving the item mid-run) against real Redis and SQL, a persister
landing while notices wait (each is answered once SQL holds what it did).

Notices carry a charge: mostly the order's sum, sometimes a cent off or another currency, and
some name an order nobody issued. The invariant, after every step: every success notice ever
accepted is exactly one of the payment of a paid order with the order's sum or a refund owed of
the sum charged for that payment, no payment id belongs to two orders
(as the live side records them: Redis while the item is on sale, SQL once archived), and a
notice sent again is answered as it was the first time (checked as each retry is sent). Exact
answers are test_engine_model.py's; this machine holds the money rule through races and
archiving, which a sequential model does not see.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.holds import HoldState, PaymentSettlement
from seckill.domain.items import NewItem
from seckill.domain.money import Money
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.audit import recorded_charge, redis_accounts
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.services.archive import Archivist
from seckill.services.orders import OrderBook, OrderNotFound
from seckill.services.reconcile.drift import sql_accounts
from seckill.services.reconcile.records import audit_records
from seckill.store.database import open_database
from seckill.store.ledger import Ledger
from seckill.store.tables import Base
from seckill.workers.persister import Persister, PersisterConfig
from tests.conftest import SERVER_BACKENDS, ManualClock, RedisTarget, client_of, flush

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

MODEL_SETTINGS = settings(
    max_examples=8,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
BUYERS = tuple(f"buyer-{n}" for n in range(8))  # over three shards: claims happen often
PAYMENT_IDS = ("p1", "p2", "p3", "p4")  # few, so ids are reused across orders and shards
HOLD_MS = 1_000
T = TypeVar("T")


PRICE = Money(700, "USD")  # the item's; every order is of one unit
CHARGES = st.sampled_from(
    [PRICE, PRICE, PRICE, Money(699, "USD"), Money(701, "USD"), Money(700, "EUR")]
)
UNKNOWN_ORDER = 999_999  # an order id never issued


@dataclass(frozen=True)
class Notice:
    order_id: int
    payment_id: str
    succeeded: bool
    charged: Money = PRICE


class MoneyMachine(RuleBasedStateMachine):
    runner: ClassVar[asyncio.Runner]
    target: ClassVar[RedisTarget]
    sql_url: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        # The sale's window is in the past of the wall clock (so archiving finds it ended) and
        # its engine decides on a clock of the test's own, inside the window.
        starts = datetime.now(UTC) - timedelta(days=1)
        self.clock = ManualClock(int(starts.timestamp() * 1000) + 1_000)
        self.redis = client_of(self.target, max_connections=16)
        self.database = open_database(self.sql_url)
        self.ledger = Ledger(self.database)
        scripts = Scripts(self.redis)
        self.engine = RedisEngine(
            self.redis,
            scripts=scripts,
            idempotency_ttl_ms=3_600_000,
            clock=self.clock,
            prefix=DEFAULT_PREFIX,
        )
        self.item_id = self.run(self.start(scripts, starts))
        self.book = OrderBook(engine=self.engine, ledger=self.ledger)
        self.orders: list[int] = []
        self.first: dict[Notice, PaymentSettlement] = {}  # each accepted notice's first answer
        self.archived = False
        self.order_ids = itertools.count(1_000)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    async def start(self, scripts: Scripts, starts: datetime) -> int:
        await flush(self.redis)
        await scripts.load()
        async with self.database.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                await conn.execute(table.delete())
        item_id = await self.ledger.create_item(
            NewItem(
                name="Charged item", price_cents=700, total=6, starts_at=starts,
                ends_at=starts + timedelta(hours=1), per_buyer_limit=2,
                hold_seconds=HOLD_MS // 1000, stock_shards=3,
            )
        )  # fmt: skip
        record = await self.ledger.item(item_id)
        assert record is not None
        await self.engine.load_item(record.sale_item())
        return item_id

    def teardown(self) -> None:
        self.run(self.redis.aclose())
        self.run(self.database.dispose())

    def persister(self) -> Persister:
        # Nothing writes while it lands, so a read that waits for new entries waits in vain:
        # 10 ms, not the default second (two quiet reads at 1 s made archiving most of the run).
        return Persister(
            redis=self.redis,
            ledger=self.ledger,
            consumer="model",
            config=PersisterConfig(block_ms=10),
            prefix=DEFAULT_PREFIX,
        )

    async def land(self) -> None:
        persister = self.persister()
        quiet = 0
        while quiet < 2:
            quiet = quiet + 1 if await persister.run_once() == 0 else 0

    async def landing(self, answers: Coroutine[Any, Any, T]) -> T:
        """``answers`` (notices), with the persister landing meanwhile: a notice is answered
        once SQL holds what it did."""
        answered = asyncio.ensure_future(answers)
        persister = self.persister()
        while not answered.done():
            await persister.run_once()
        return answered.result()

    # -- what a provider sends -----------------------------------------------------------------

    async def notify(self, notice: Notice) -> PaymentSettlement | InvalidRequest:
        try:
            settlement, _ = await self.book.settle_payment(
                self.item_id,
                notice.order_id,
                payment_id=notice.payment_id,
                succeeded=notice.succeeded,
                charged=notice.charged,
            )
        except InvalidRequest as refused:
            return refused
        except OrderNotFound:  # a failure for an order nobody knows: 404, nothing recorded
            assert not notice.succeeded and notice.order_id == UNKNOWN_ORDER, notice
            return InvalidRequest(ErrorCode.INVALID_ORDER_ID, "unknown")
        return settlement

    def learn(self, notice: Notice, answer: PaymentSettlement | InvalidRequest) -> None:
        if isinstance(answer, PaymentSettlement):
            first = self.first.setdefault(notice, answer)
            assert (answer.outcome, answer.reason) == (first.outcome, first.reason), notice
            assert answer.replayed == (first is not answer), (notice, answer)

    @initialize(buyers=st.lists(st.sampled_from(BUYERS), min_size=2, max_size=5))
    def open_sale(self, buyers: list[str]) -> None:
        for buyer in buyers:
            self.reserve(buyer)

    @precondition(lambda self: not self.archived)
    @rule(buyer=st.sampled_from(BUYERS))
    def reserve(self, buyer: str) -> None:
        answer = self.run(
            self.engine.reserve(
                self.item_id, buyer=buyer, quantity=1,
                idempotency_key=f"k{len(self.orders)}", order_id=next(self.order_ids),
            )
        )  # fmt: skip
        if answer.accepted and answer.order_id is not None:
            self.orders.append(answer.order_id)

    @precondition(lambda self: self.orders)
    @rule(
        data=st.data(),
        payment_id=st.one_of(st.sampled_from(PAYMENT_IDS), st.uuids().map(str)),
        succeeded=st.booleans(),
        charged=CHARGES,
    )
    def notice(self, data: st.DataObject, payment_id: str, succeeded: bool, charged: Money) -> None:
        order_id = data.draw(st.sampled_from([*self.orders, UNKNOWN_ORDER]), label="order")
        notice = Notice(order_id, payment_id, succeeded, charged)
        self.learn(notice, self.run(self.landing(self.notify(notice))))

    @precondition(lambda self: self.first)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """The provider sends a notice again: its first answer, replayed."""
        notice = data.draw(st.sampled_from(sorted(self.first, key=repr)), label="retried")
        answer = self.run(self.landing(self.notify(notice)))
        assert isinstance(answer, PaymentSettlement), (notice, answer)
        self.learn(notice, answer)

    @precondition(lambda self: len(self.orders) >= 2)
    @rule(data=st.data(), payment_id=st.sampled_from(PAYMENT_IDS), same_order=st.booleans())
    def at_once(self, data: st.DataObject, payment_id: str, same_order: bool) -> None:
        """Two successes at the same moment: one payment id for two orders (on any shards), or
        two payment ids for one order (a double click)."""
        first, second = data.draw(
            st.lists(st.sampled_from(self.orders), min_size=2, max_size=2, unique=True),
            label="orders",
        )
        pair = (
            (Notice(first, f"{payment_id}-a", True), Notice(first, f"{payment_id}-b", True))
            if same_order
            else (Notice(first, payment_id, True), Notice(second, payment_id, True))
        )

        async def both() -> list[Any]:
            return list(await asyncio.gather(*(self.notify(n) for n in pair)))

        for notice, answer in zip(pair, self.run(self.landing(both())), strict=True):
            self.learn(notice, answer)

    @precondition(lambda self: self.orders and not self.archived)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        order_id = data.draw(st.sampled_from(self.orders), label="order")
        self.run(self.engine.release(self.item_id, order_id, ReleaseReason.CANCELLED))

    @precondition(lambda self: not self.archived)
    @rule(ms=st.sampled_from([300, HOLD_MS]))
    def time_passes(self, ms: int) -> None:
        """Holds run out (a payment at or after its deadline is late), and the reaper passes."""
        self.clock.advance(ms)
        for shard in range(3):
            self.run(self.engine.expire_due(self.item_id, shard=shard))

    @precondition(lambda self: not self.archived)
    @rule()
    def archive(self) -> None:
        """The sale ends, every hold runs out, the stream lands, and the item is archived: its
        notices move to SQL, which answers every one from then on."""
        record = self.run(self.ledger.item(self.item_id))
        assert record is not None
        self.clock.now_ms = max(self.clock.now_ms, int(record.ends_at.timestamp() * 1000) + 1_000)
        for shard in range(3):
            while self.run(self.engine.expire_due(self.item_id, shard=shard)):
                pass
        self.run(self.land())
        audit = self.run(audit_records(self.engine, self.ledger, self.item_id))
        assert all(c.ok for c in audit), [c for c in audit if not c.ok]  # SQL agrees, money too
        archivist = Archivist(engine=self.engine, ledger=self.ledger, grace=timedelta(0))
        done = self.run(archivist.archive(self.item_id))
        assert done.removed, done.hindrances
        self.archived = True

    # -- the rule ------------------------------------------------------------------------------

    @invariant()
    def every_charge_is_a_sale_or_a_refund_owed(self) -> None:
        accepted = [
            (n, a)
            for n, a in self.first.items()
            if n.succeeded and a.outcome is not Outcome.UNKNOWN_ORDER
        ]
        assert {a.outcome for _, a in accepted} <= {Outcome.PAID, Outcome.REFUND_REQUIRED}
        if self.archived:
            book = self.run(self.ledger.book(self.item_id))
            paid_by = {
                o.order_id: o.payment_id
                for o in book.orders.values()
                if o.status is OrderStatus.PAID
            }
            refunds = {p: r.order_id for p, r in book.refunds.items()}
            refund_sums = {p: r.charged for p, r in book.refunds.items()}
            system = sql_accounts(book)
        else:
            snapshots = [self.run(self.engine.snapshot(self.item_id, s)) for s in range(3)]
            holds = {o: h for s in snapshots for o, h in s.holds.items()}
            paid_by = {o: h.payment_id for o, h in holds.items() if h.state is HoldState.PAID}
            owed = [
                (p, r)
                for s in snapshots
                for p, r in s.payments.items()
                if r.get("outcome") == "refund_required"
            ]
            refunds = {p: int(r["order_id"]) for p, r in owed}
            refund_sums = {p: recorded_charge(r) for p, r in owed}
            system = redis_accounts(snapshots)
        assert system.balanced, system.summary()
        orders_of: dict[str, set[int]] = defaultdict(set)
        for notice in self.first:  # accepted notices, failures too: one order per payment id
            orders_of[notice.payment_id].add(notice.order_id)
        assert all(len(orders) == 1 for orders in orders_of.values()), orders_of
        for notice, answer in accepted:  # exactly one of the two
            sale = paid_by.get(notice.order_id) == notice.payment_id
            refund = refunds.get(notice.payment_id) == notice.order_id
            assert sale != refund, (notice, answer, sale, refund)
            assert sale == (answer.outcome is Outcome.PAID), (notice, answer)
            if sale:  # paid with the order's sum (one unit)
                assert notice.charged == PRICE, (notice, answer)
            else:  # owed back, of the sum charged
                assert refund_sums[notice.payment_id] == notice.charged, (notice, answer)
                if notice.order_id == UNKNOWN_ORDER:
                    assert answer.reason is RefundReason.UNKNOWN_ORDER, (notice, answer)
                elif notice.charged != PRICE:
                    assert answer.reason in (
                        RefundReason.AMOUNT_MISMATCH, RefundReason.CURRENCY_MISMATCH
                    ), (notice, answer)  # fmt: skip


def run_machine(redis_server: RedisTarget, sql_url: str, machine_settings: settings) -> None:
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as loop_runner:

        class Bound(MoneyMachine):
            runner = loop_runner
            target = redis_server

        Bound.sql_url = sql_url
        run_state_machine_as_test(Bound, settings=machine_settings)


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_every_charge_is_accounted_for(redis_server: RedisTarget, sql_url: str) -> None:
    """Every Redis variant, on SQLite: the races are Redis's to settle."""
    run_machine(redis_server, sql_url, MODEL_SETTINGS)


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", SERVER_BACKENDS, indirect=True)
def test_every_charge_is_accounted_for_on_sql_servers(
    redis_server: RedisTarget, sql_url: str
) -> None:
    """The SQL servers, with fewer examples: refunds landing and archived notices settled in
    PostgreSQL and MariaDB (their locks, their keys)."""
    run_machine(redis_server, sql_url, settings(MODEL_SETTINGS, max_examples=5))
