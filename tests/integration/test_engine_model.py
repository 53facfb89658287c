"""The real engine, driven by random operation sequences, against a plain-Python model of its rules.

Hypothesis picks the operations (reserve, rushes of buyers in one millisecond, replay, provider
payment notices, release, restock, clock moves, reaper batches, and payments or reaping landed
right on a deadline) over one or two small items and a few buyers, idempotency keys and payment
ids, so replays, key and payment id reuse, limits, sell-outs, pay-versus-timeout races, late
payments and second charges (refunds owed) happen often. The model predicts every answer
exactly; after every step the engine's state must equal the model's and every check of
``seckill.engine.audit`` (the one home of the README's invariants) must pass.

The engine is async and the state machine is sync: each run owns one event loop (never installed
as the thread's current loop, so the session loop of pytest-asyncio is left alone) and every
engine call runs to completion on it. Each Hypothesis example starts from FLUSHALL with its own
client, closed in ``teardown``. A short test at the end pins, on the same model, the deadline
edges a random search meets only by luck.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
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
from seckill.domain.holds import (
    Hold,
    HoldState,
    HoldTransition,
    PaymentSettlement,
    Reservation,
)
from seckill.domain.items import SaleItem, Stock
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.domain.shards import home_shard
from seckill.engine.audit import audit_item
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from tests.conftest import FREE, ManualClock, RedisTarget, client_of, flush, pay

pytestmark = pytest.mark.redis_variants("redis6.2", "redis7", "cluster")

START_MS = 1_800_000_000_000  # a fixed epoch (2027), so a failing example replays exactly
IDEMPOTENCY_TTL_MS = 3_600_000  # Redis-time PX; no real hour passes within one example
BUYERS = ("al", "bob", "carol", "d")  # varied lengths: the key layout encodes the buyer's length
KEYS = ("k1", "k2", "k3")
PAYMENT_IDS = ("pay-1", "pay-2", "pay-3")  # few, so a notice often reuses one

MODEL_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SHARDED_SETTINGS = settings(MODEL_SETTINGS, max_examples=30)

# Ids of several lengths, up to 19-digit (snowflake-sized) ones: the deadlines ZSET orders equal
# deadlines by member *string*, so "10" goes before "9", and 64-bit ids must survive Lua.
order_ids = st.one_of(st.integers(1, 99), st.integers(100, 999_999), st.integers(2**62, 2**63 - 1))

Answer = Reservation | HoldTransition | PaymentSettlement | Outcome | ErrorCode
# A payment id's recorded answer: (order id, succeeded, outcome, reason).
PaymentRecord = tuple[int, bool, Outcome, ReleaseReason | RefundReason | None]
T = TypeVar("T")


@dataclass
class ItemModel:
    """One item as the rules say it should be: counters, holds, buyers, keys and journal."""

    item: SaleItem
    available: int
    held: int = 0
    sold: int = 0
    holds: dict[int, Hold] = field(default_factory=dict)
    buyers: Counter[str] = field(default_factory=Counter)
    # (buyer, idempotency key) -> the first reservation's (order id, quantity, deadline)
    keys: dict[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)
    journal: list[tuple[str, str, str]] = field(default_factory=list)  # (event, order id, reason)
    payments: dict[str, PaymentRecord] = field(default_factory=dict)
    # Order ids a charge named before any hold had them (refunds owed for unknown orders).
    named_unknown: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.journal.append(("loaded", "", ""))

    def stock(self) -> Stock:
        return Stock(self.item.total, self.available, self.held, self.sold)

    def reserve(
        self, buyer: str, key: str, quantity: int, order_id: int, now: int
    ) -> Reservation | ErrorCode:
        # The order of checks is reserve.lua's: key record, input guards, window, limit, stock.
        seen = self.keys.get((buyer, key))
        if seen is not None:
            first_order, first_quantity, deadline = seen
            outcome = Outcome.RESERVED if first_quantity == quantity else Outcome.KEY_REUSED
            return Reservation(outcome, first_order, deadline, replayed=True)
        item = self.item
        if quantity > item.per_buyer_limit:
            return ErrorCode.QUANTITY_ABOVE_LIMIT
        if order_id in self.holds:
            return ErrorCode.DUPLICATE_ORDER_ID
        if now < item.starts_at_ms:
            return Reservation(Outcome.NOT_STARTED)
        if now >= item.ends_at_ms:
            return Reservation(Outcome.ENDED)
        if self.buyers[buyer] + quantity > item.per_buyer_limit:
            return Reservation(Outcome.LIMIT_REACHED)
        if self.available <= 0:
            return Reservation(Outcome.SOLD_OUT)
        if self.available < quantity:
            return Reservation(Outcome.INSUFFICIENT_STOCK)
        deadline = now + item.hold_ms
        self.available -= quantity
        self.held += quantity
        self.buyers[buyer] += quantity
        self.holds[order_id] = Hold(order_id, buyer, quantity, deadline, HoldState.HELD)
        self.keys[buyer, key] = (order_id, quantity, deadline)
        self.journal.append(("reserved", str(order_id), ""))
        return Reservation(Outcome.RESERVED, order_id, deadline)

    def _release(self, hold: Hold, reason: ReleaseReason) -> None:
        self.held -= hold.quantity
        self.available += hold.quantity
        self.buyers[hold.buyer] -= hold.quantity
        if self.buyers[hold.buyer] <= 0:
            del self.buyers[hold.buyer]
        self.holds[hold.order_id] = replace(hold, state=HoldState.RELEASED, reason=reason)
        self.journal.append(("released", str(hold.order_id), reason.value))

    def pay(self, hold: Hold, payment_id: str, now: int) -> PaymentSettlement:
        """A payment succeeded: pay() of settle_payment.lua. Every charge that pays nothing is a
        refund owed, journaled once per payment id."""
        if hold.state is HoldState.PAID:
            return self._refund(hold, payment_id, RefundReason.DUPLICATE_CHARGE)
        if hold.state is HoldState.HELD and now >= hold.deadline_ms:
            self._release(hold, ReleaseReason.EXPIRED)
            hold = self.holds[hold.order_id]
        if hold.state is HoldState.RELEASED:
            assert hold.reason is not None
            self.holds[hold.order_id] = replace(hold, refund_required=True)
            return self._refund(hold, payment_id, RefundReason(hold.reason.value))
        self.held -= hold.quantity
        self.sold += hold.quantity
        self.holds[hold.order_id] = replace(hold, state=HoldState.PAID, payment_id=payment_id)
        self.journal.append(("paid", str(hold.order_id), ""))
        return PaymentSettlement(Outcome.PAID)

    def _refund(self, hold: Hold, payment_id: str, reason: RefundReason) -> PaymentSettlement:
        self.journal.append(("refund_required", str(hold.order_id), reason.value))
        return PaymentSettlement(Outcome.REFUND_REQUIRED, reason)

    def settle_payment(
        self, order_id: int, payment_id: str, succeeded: bool, now: int
    ) -> PaymentSettlement | ErrorCode:
        seen = self.payments.get(payment_id)
        if seen is not None:
            first_order, first_succeeded, outcome, reason = seen
            if (first_order, first_succeeded) != (order_id, succeeded):
                return ErrorCode.PAYMENT_ID_REUSED
            return PaymentSettlement(outcome, reason, replayed=True)
        hold = self.holds.get(order_id)
        if hold is None and not succeeded:
            return PaymentSettlement(Outcome.UNKNOWN_ORDER)  # and not recorded
        answer: PaymentSettlement
        if hold is None:  # money taken for an order nobody holds: owed back
            self.named_unknown.add(order_id)
            reason = RefundReason.UNKNOWN_ORDER
            self.journal.append(("refund_required", str(order_id), reason.value))
            answer = PaymentSettlement(Outcome.REFUND_REQUIRED, reason)
        elif succeeded:
            answer = self.pay(hold, payment_id, now)
        elif hold.state is HoldState.PAID:
            answer = PaymentSettlement(Outcome.ALREADY_PAID)
        elif hold.state is HoldState.RELEASED:
            answer = PaymentSettlement(Outcome.ALREADY_RELEASED, hold.reason)
        else:
            self._release(hold, ReleaseReason.PAYMENT_FAILED)
            answer = PaymentSettlement(Outcome.RELEASED, ReleaseReason.PAYMENT_FAILED)
        self.payments[payment_id] = (order_id, succeeded, answer.outcome, answer.reason)
        return answer

    def release(self, order_id: int, reason: ReleaseReason) -> HoldTransition:
        hold = self.holds.get(order_id)
        if hold is None:
            return HoldTransition(Outcome.UNKNOWN_ORDER)
        if hold.state is HoldState.PAID:
            return HoldTransition(Outcome.ALREADY_PAID)
        if hold.state is HoldState.RELEASED:
            return HoldTransition(Outcome.ALREADY_RELEASED, hold.reason)
        self._release(hold, reason)
        return HoldTransition(Outcome.RELEASED, reason)

    def expire_due(self, now: int, limit: int) -> list[int]:
        due = sorted(
            (h for h in self.holds.values() if h.state is HoldState.HELD and h.deadline_ms <= now),
            key=lambda h: (h.deadline_ms, str(h.order_id)),
        )[:limit]
        for hold in due:
            self._release(hold, ReleaseReason.EXPIRED)
        return [hold.order_id for hold in due]

    def restock(self, total: int, *, force: bool) -> Outcome | ErrorCode:
        committed = self.held + self.sold
        code = Outcome.LOADED
        if committed:
            if not force:
                return ErrorCode.ITEM_ACTIVE
            if total < committed:
                return ErrorCode.TOTAL_BELOW_COMMITTED
            code = Outcome.RELOADED
        self.item = replace(self.item, total=total)
        self.available = total - committed
        self.journal.append(("loaded", "", ""))
        return code


@dataclass(frozen=True)
class Snapshot:
    """Everything the engine holds for one item, read on a quiet item."""

    stock: Stock | None
    holds: dict[int, Hold]
    buyers: dict[str, int]
    deadlines: dict[int, int]
    journal: list[tuple[str, str, str]]
    keys: dict[str, tuple[int, int, int]]
    payments: dict[str, PaymentRecord]
    failed_checks: list[str]


class EngineModel(RuleBasedStateMachine):
    """Bound to a live loop and a redis-server by the test below (see the test at the end)."""

    runner: ClassVar[asyncio.Runner]
    target: ClassVar[RedisTarget]
    # With stock shards every answer stays the model's (one unsharded item): operations come one
    # at a time, so a short home shard always finds the units the others have.
    stock_shards: ClassVar[int] = 1

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(START_MS)
        self.redis = client_of(self.target, max_connections=8)
        scripts = Scripts(self.redis)
        self.runner.run(self.start_clean(scripts))
        self.engine = RedisEngine(
            self.redis,
            scripts=scripts,
            idempotency_ttl_ms=IDEMPOTENCY_TTL_MS,
            clock=self.clock,
            prefix=DEFAULT_PREFIX,
        )
        self.items: dict[int, ItemModel] = {}
        self.touched: set[int] = set()  # items an engine call may have changed since the check
        # Fresh reservations, (item id, buyer, key, quantity, answer), for replays to repeat.
        self.granted: list[tuple[int, str, str, int, Reservation]] = []

    async def start_clean(self, scripts: Scripts) -> None:
        await flush(self.redis)
        await scripts.load()

    def call(self, item_id: int, coro: Coroutine[Any, Any, T]) -> T:
        """Run one engine call on ``item_id`` to completion; the next check reads that item.

        Every script gets only its own item's keys (DESIGN: scripts never build key names), so
        an item no call touched cannot have changed and its check is skipped. (A call that wrote
        to the wrong item would still fail: the item it was meant for would not match.)
        """
        self.touched.add(item_id)
        return self.runner.run(coro)

    def teardown(self) -> None:
        self.runner.run(self.redis.aclose())

    def known_order_ids(self) -> list[int]:
        return sorted({o for m in self.items.values() for o in m.holds})

    def draw_item(self, data: st.DataObject) -> tuple[int, ItemModel]:
        item_id = data.draw(st.sampled_from(sorted(self.items)), label="item")
        return item_id, self.items[item_id]

    def draw_new_order_id(self, data: st.DataObject) -> int:
        """Usually an id never used (a collision is fine: the model predicts it), sometimes one
        that names a hold already, on this item (``duplicate_order_id``) or the other one."""
        known = self.known_order_ids()
        if known and data.draw(st.integers(0, 4), label="reuse an order id") == 4:
            return data.draw(st.sampled_from(known), label="order_id")
        return data.draw(order_ids, label="order_id")

    def draw_order_id(self, data: st.DataObject, model: ItemModel) -> int:
        """Usually one of this item's orders; sometimes another item's, or one never issued."""
        own, known = sorted(model.holds), self.known_order_ids()
        kind = data.draw(st.sampled_from(["own"] * 4 + ["any", "new"]), label="which order")
        pool = (own or known) if kind == "own" else known if kind == "any" else []
        return data.draw(st.sampled_from(pool) if pool else order_ids, label="order_id")

    def draw_quantity(self, data: st.DataObject, model: ItemModel) -> int:
        """1 to 4 units, often within the per-buyer limit (above it the script refuses)."""
        within = st.integers(1, model.item.per_buyer_limit)
        return data.draw(st.one_of(within, within, st.integers(1, 4)), label="quantity")

    # -- setup ---------------------------------------------------------------------------------

    @initialize(
        specs=st.lists(
            st.tuples(
                st.integers(1, 6),  # total
                st.integers(1, 3),  # per-buyer limit
                st.sampled_from([1_000, 1_500]),  # hold duration
                st.sampled_from([-1_000] * 7 + [1]),  # start, relative to the clock
                st.one_of(st.integers(1_000, 8_000), st.just(3_600_000)),  # end, likewise
            ),
            min_size=1,
            max_size=2,
        ),
        rush=st.lists(
            st.tuples(
                st.integers(1, 2),  # item (wraps round when there is one)
                st.sampled_from(BUYERS),
                st.sampled_from(KEYS),
                st.integers(1, 3),  # quantity (wraps round to stay within the limit)
                order_ids,
            ),
            min_size=2,
            max_size=8,
        ),
    )
    def open_sale(
        self,
        specs: list[tuple[int, int, int, int, int]],
        rush: list[tuple[int, str, str, int, int]],
    ) -> None:
        """Load the items, then a first rush of buyers in the same millisecond, so every
        example has holds to pay, release and expire, and equal deadlines to order."""
        for item_id, (total, limit, hold_ms, start, end) in enumerate(specs, start=1):
            item = SaleItem(
                item_id=item_id,
                total=total,
                starts_at_ms=START_MS + start,
                ends_at_ms=START_MS + end,
                per_buyer_limit=limit,
                hold_ms=hold_ms,
                stock_shards=self.stock_shards,
            )
            assert self.call(item_id, self.engine.load_item(item)) is Outcome.LOADED
            self.items[item_id] = ItemModel(item=item, available=total)
        for slot, buyer, key, quantity, order_id in rush:
            item_id = (slot - 1) % len(self.items) + 1
            limit = self.items[item_id].item.per_buyer_limit
            self.check_reserve(item_id, buyer, key, (quantity - 1) % limit + 1, order_id)

    # -- operations ----------------------------------------------------------------------------

    def _reserve(self, item_id: int, buyer: str, key: str, quantity: int, order_id: int) -> Answer:
        try:
            return self.call(
                item_id,
                self.engine.reserve(
                    item_id, buyer=buyer, quantity=quantity, idempotency_key=key, order_id=order_id
                ),
            )
        except InvalidRequest as exc:
            return exc.code

    @rule(
        data=st.data(),
        buyer=st.sampled_from(BUYERS),
        key=st.sampled_from(KEYS),
    )
    def reserve(self, data: st.DataObject, buyer: str, key: str) -> None:
        self.reserve_one(data, buyer, key)

    @rule(data=st.data(), size=st.integers(2, 4))
    def rush(self, data: st.DataObject, size: int) -> None:
        """Several buyers in one millisecond: the last units contested, deadlines equal."""
        for _ in range(size):
            buyer = data.draw(st.sampled_from(BUYERS), label="buyer")
            self.reserve_one(data, buyer, data.draw(st.sampled_from(KEYS), label="key"))

    def reserve_one(self, data: st.DataObject, buyer: str, key: str) -> None:
        item_id, model = self.draw_item(data)
        quantity = self.draw_quantity(data, model)
        order_id = self.draw_new_order_id(data)
        if order_id in model.named_unknown:
            # Ids are issued once, each new: an id a charge named while no hold had it is never
            # issued after (the audit holds that charge's refund to the id staying unheld).
            return
        self.check_reserve(item_id, buyer, key, quantity, order_id)

    def check_reserve(
        self, item_id: int, buyer: str, key: str, quantity: int, order_id: int
    ) -> None:
        known = self.known_order_ids()
        if self.stock_shards > 1 and order_id in known:
            # A shard checks order ids against its own holds only: ids are unique as issued
            # (domain.ids), the check is a last guard. So the sharded model never reuses one.
            order_id = (
                max(known) + 1 if max(known) < 2**63 - 1 else min(set(range(1, 99)) - set(known))
            )
        expected = self.items[item_id].reserve(buyer, key, quantity, order_id, self.clock())
        got = self._reserve(item_id, buyer, key, quantity, order_id)
        assert got == expected, f"reserve: engine {got!r}, model {expected!r}"
        if isinstance(got, Reservation) and got.accepted and not got.replayed:
            self.granted.append((item_id, buyer, key, quantity, got))

    @precondition(lambda self: self.granted)
    @rule(data=st.data(), same_order_id=st.booleans())
    def replay(self, data: st.DataObject, same_order_id: bool) -> None:
        """A client retry: the identical original answer, whatever happened to the hold since."""
        item_id, buyer, key, quantity, first = data.draw(st.sampled_from(self.granted))
        order_id = first.order_id if same_order_id else data.draw(order_ids, label="order_id")
        assert order_id is not None
        got = self._reserve(item_id, buyer, key, quantity, order_id)
        assert got == replace(first, replayed=True), f"replay: engine {got!r}, first {first!r}"
        expected = self.items[item_id].reserve(buyer, key, quantity, order_id, self.clock())
        assert got == expected, f"replay: engine {got!r}, model {expected!r}"

    def check_settle_payment(
        self, item_id: int, order_id: int, payment_id: str, succeeded: bool
    ) -> None:
        expected = self.items[item_id].settle_payment(order_id, payment_id, succeeded, self.clock())
        try:
            got: Answer = self.call(
                item_id,
                self.engine.settle_payment(
                    item_id,
                    order_id,
                    payment_id=payment_id,
                    succeeded=succeeded,
                    charged=FREE,
                    unit_price=FREE,
                ),
            )
        except InvalidRequest as exc:
            got = exc.code
        assert got == expected, (
            f"settle_payment {order_id} {payment_id} {succeeded}: engine {got!r}, "
            f"model {expected!r}"
        )

    def check_release(self, item_id: int, order_id: int, reason: ReleaseReason) -> None:
        expected = self.items[item_id].release(order_id, reason)
        got = self.call(item_id, self.engine.release(item_id, order_id, reason))
        assert got == expected, f"release {order_id}: engine {got!r}, model {expected!r}"

    def check_expire_due(self, item_id: int, limit: int) -> None:
        if self.stock_shards > 1:  # each shard reaps its own: compare a whole pass
            expected = sorted(self.items[item_id].expire_due(self.clock(), 10_000))
            got = sorted(self.call(item_id, self._expire_every_shard(item_id)))
        else:
            expected = self.items[item_id].expire_due(self.clock(), limit)
            got = self.call(item_id, self.engine.expire_due(item_id, limit=limit))
        assert got == expected, f"expire_due(limit={limit}): engine {got}, model {expected}"

    async def _expire_every_shard(self, item_id: int) -> list[int]:
        return [
            order_id
            for shard in range(self.stock_shards)
            for order_id in await self.engine.expire_due(item_id, limit=10_000, shard=shard)
        ]

    @rule(
        data=st.data(),
        payment_id=st.sampled_from(PAYMENT_IDS),
        succeeded=st.booleans(),
        retried=st.booleans(),
    )
    def settle_payment(
        self, data: st.DataObject, payment_id: str, succeeded: bool, retried: bool
    ) -> None:
        """A provider's notice; ``retried``: the provider sends it twice."""
        item_id, model = self.draw_item(data)
        order_id = self.draw_order_id(data, model)
        for _ in range(1 + retried):
            self.check_settle_payment(item_id, order_id, payment_id, succeeded)

    @rule(data=st.data(), reason=st.sampled_from(ReleaseReason), retried=st.booleans())
    def release(self, data: st.DataObject, reason: ReleaseReason, retried: bool) -> None:
        """A cancel or failed payment; ``retried``: sent twice (the second may say otherwise)."""
        item_id, model = self.draw_item(data)
        order_id = self.draw_order_id(data, model)
        self.check_release(item_id, order_id, reason)
        if retried:
            self.check_release(item_id, order_id, data.draw(st.sampled_from(ReleaseReason)))

    @rule(data=st.data(), total=st.integers(0, 6), force=st.booleans())
    def restock(self, data: st.DataObject, total: int, force: bool) -> None:
        """Reload the item with a new total (other settings unchanged)."""
        item_id, model = self.draw_item(data)
        new_item = replace(model.item, total=total)
        expected: Outcome | ErrorCode
        if self.stock_shards > 1 and total != model.item.total:
            expected = ErrorCode.STOCK_SHARDS_FIXED
        else:
            expected = model.restock(total, force=force)
        try:
            got: Answer = self.call(item_id, self.engine.load_item(new_item, force=force))
        except InvalidRequest as exc:
            got = exc.code
        assert got == expected, f"restock: engine {got!r}, model {expected!r}"

    @rule(ms=st.one_of(st.integers(0, 3), st.integers(0, 800)))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(data=st.data(), limit=st.integers(1, 4))
    def expire_due(self, data: st.DataObject, limit: int) -> None:
        item_id, _ = self.draw_item(data)
        self.check_expire_due(item_id, limit)

    def any_held(self) -> bool:
        return any(h.state is HoldState.HELD for m in self.items.values() for h in m.holds.values())

    def land_on_deadline(self, data: st.DataObject, offset: int) -> tuple[int, Hold]:
        """Move the clock to a held order's deadline (or 1 ms either side): where pay and
        expiry race. Time never runs backwards: a deadline behind the clock is just overdue."""
        item_id, hold = data.draw(
            st.sampled_from(
                [
                    (item_id, h)
                    for item_id, m in self.items.items()
                    for h in m.holds.values()
                    if h.state is HoldState.HELD
                ]
            ),
            label="held order",
        )
        self.clock.now_ms = max(self.clock.now_ms, hold.deadline_ms + offset)
        return item_id, hold

    @precondition(any_held)
    @rule(
        data=st.data(),
        offset=st.sampled_from([-1, 0, 1]),
        payment_id=st.sampled_from(PAYMENT_IDS),
    )
    def pay_at_deadline(self, data: st.DataObject, offset: int, payment_id: str) -> None:
        """The payment lands on the deadline: 1 ms before pays, the deadline itself is late (a
        refund owed)."""
        item_id, hold = self.land_on_deadline(data, offset)
        self.check_settle_payment(item_id, hold.order_id, payment_id, True)

    @precondition(any_held)
    @rule(data=st.data(), offset=st.sampled_from([-1, 0, 1]), limit=st.integers(1, 4))
    def reap_at_deadline(self, data: st.DataObject, offset: int, limit: int) -> None:
        """The reaper runs on the deadline: a hold is due from its deadline on, oldest first,
        equal deadlines in the deadlines index's member order."""
        item_id, _ = self.land_on_deadline(data, offset)
        self.check_expire_due(item_id, limit)

    # -- after every step ----------------------------------------------------------------------

    async def snapshot(self, item_id: int) -> Snapshot:
        engine, redis = self.engine, self.redis
        shards = [engine.keys(item_id, s) for s in range(self.stock_shards)]
        names = sorted(
            [
                str(name)
                for keys in shards
                async for name in redis.scan_iter(match=keys.idempotency_prefix + "*")
            ]
        )
        records = [json.loads(str(await redis.get(name))) for name in names]
        payments = {
            payment_id: json.loads(raw)
            for keys in shards
            for payment_id, raw in (await redis.hgetall(keys.payments)).items()
        }
        journal = [
            (f["event"], f.get("order_id", ""), f.get("reason", ""))
            for keys in shards
            for _, f in await engine.events(item_id, keys.shard)
            if not f["event"].startswith("transferred")
        ]
        return Snapshot(
            stock=await engine.stock(item_id),
            holds=await engine.holds(item_id),
            buyers=await engine.buyer_units(item_id),
            deadlines=await engine.deadlines(item_id),
            journal=journal,
            keys={
                name: (int(r["order_id"]), r["quantity"], r["deadline_ms"])
                for name, r in zip(names, records, strict=True)
            },
            payments={
                payment_id: (
                    int(p["order_id"]),
                    p["succeeded"],
                    Outcome(p["outcome"]),
                    _reason(Outcome(p["outcome"]), p.get("reason")),
                )
                for payment_id, p in payments.items()
            },
            failed_checks=[
                f"{c.name}: {c.detail}" for c in await audit_item(engine, item_id) if not c.ok
            ],
        )

    @invariant()
    def engine_matches_model(self) -> None:
        touched, self.touched = sorted(self.touched), set()
        for item_id in touched:
            model = self.items[item_id]
            seen = self.runner.run(self.snapshot(item_id))
            assert not seen.failed_checks, f"item {item_id} audit failed: {seen.failed_checks}"
            assert seen.stock == model.stock(), f"item {item_id} stock"
            assert seen.holds == model.holds, f"item {item_id} holds"
            assert seen.buyers == dict(model.buyers), f"item {item_id} buyer units"
            assert seen.deadlines == {
                h.order_id: h.deadline_ms for h in model.holds.values() if h.state is HoldState.HELD
            }, f"item {item_id} deadlines index"
            if self.stock_shards == 1:
                assert seen.journal == model.journal, f"item {item_id} journal"
            else:  # one stream per shard, each loaded once: ordered within a shard only
                orders = Counter(e for e in model.journal if e[0] != "loaded")
                assert Counter(e for e in seen.journal if e[0] != "loaded") == orders, "journal"
            shards = self.stock_shards
            assert seen.keys == {
                self.engine.keys(item_id, home_shard(buyer, shards)).idempotency(buyer, key): record
                for (buyer, key), record in model.keys.items()
            }, f"item {item_id} idempotency records"
            assert seen.payments == model.payments, f"item {item_id} payment records"


def _reason(outcome: Outcome, reason: str | None) -> ReleaseReason | RefundReason | None:
    if reason is None:
        return None
    return RefundReason(reason) if outcome is Outcome.REFUND_REQUIRED else ReleaseReason(reason)


def test_engine_matches_model(redis_server: RedisTarget) -> None:
    # loop_factory keeps the Runner from installing (and later clearing) the thread's loop.
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as loop_runner:

        class BoundEngineModel(EngineModel):
            runner = loop_runner
            target = redis_server

        run_state_machine_as_test(BoundEngineModel, settings=MODEL_SETTINGS)


# The same machine with fewer examples (shards add round trips, not rules); Redis 7 and cluster.
@pytest.mark.redis_variants("redis7", "cluster")
def test_sharded_engine_matches_model(redis_server: RedisTarget) -> None:
    """The same model over items whose stock is split over three shards: every answer, counter,
    hold, buyer count, key and payment record as on one shard, and the audit (each shard, the
    item across them, orders on their home shard) after every step."""
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as loop_runner:

        class BoundEngineModel(EngineModel):
            runner = loop_runner
            target = redis_server
            stock_shards = 3

        run_state_machine_as_test(BoundEngineModel, settings=SHARDED_SETTINGS)


async def test_deadline_edges_pinned(timed_engine: RedisEngine, clock: ManualClock) -> None:
    """The edges the machine meets only by luck, pinned on the same model: a hold is due from
    its deadline on (paying 1 ms earlier still works), and equal deadlines are reaped in
    member-string order, so order 10 goes before order 9."""
    item = SaleItem(
        item_id=1,
        total=6,
        starts_at_ms=clock.now_ms - 1,
        ends_at_ms=clock.now_ms + 3_600_000,
        per_buyer_limit=1,
        hold_ms=1_000,
    )
    model = ItemModel(item=item, available=item.total)
    assert await timed_engine.load_item(item) is Outcome.LOADED
    for buyer, order_id in [("a", 9), ("b", 10), ("c", 2**62), ("d", 123)]:
        expected = model.reserve(buyer, "k", 1, order_id, clock())
        got = await timed_engine.reserve(
            1, buyer=buyer, quantity=1, idempotency_key="k", order_id=order_id
        )
        assert got == expected == Reservation(Outcome.RESERVED, order_id, clock() + 1_000)

    clock.advance(999)
    assert await timed_engine.expire_due(1) == model.expire_due(clock(), 500) == []
    late = model.reserve("e", "k", 1, 77, clock())  # due 1 s from now
    assert (
        await timed_engine.reserve(1, buyer="e", quantity=1, idempotency_key="k", order_id=77)
        == late
    )

    clock.advance(1)  # the first four deadlines, exactly
    reaped = model.expire_due(clock(), 3)
    assert reaped == [10, 123, 2**62]  # "10" < "123" < "4611686018427387904" < "9"
    assert await timed_engine.expire_due(1, limit=3) == reaped
    paid_late = model.settle_payment(9, "pay-9", True, clock())
    assert paid_late == PaymentSettlement(Outcome.REFUND_REQUIRED, RefundReason.EXPIRED)
    assert await pay(timed_engine, 1, 9, "pay-9") == paid_late

    clock.advance(998)  # 1 ms before order 77's deadline
    assert (
        await pay(timed_engine, 1, 77, "pay-77")
        == model.settle_payment(77, "pay-77", True, clock())
        == PaymentSettlement(Outcome.PAID)
    )
    assert all(check.ok for check in await audit_item(timed_engine, 1))
    assert await timed_engine.stock(1) == model.stock()
    assert await timed_engine.holds(1) == model.holds
