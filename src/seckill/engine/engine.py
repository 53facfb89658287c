"""The Redis engine: plain async functions that decide and move stock, one script call each.

No framework types here, so any route, worker or benchmark can call it directly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from redis.exceptions import ResponseError

from seckill.domain import rules
from seckill.domain.events import ReleaseReason
from seckill.domain.holds import (
    Hold,
    HoldState,
    HoldTransition,
    PaymentSettlement,
    Reservation,
)
from seckill.domain.items import STOCK_FIELDS, SaleItem, Stock
from seckill.domain.outcomes import Outcome
from seckill.engine.cluster import RedisClient, time_ms
from seckill.engine.keys import DEFAULT_PREFIX, ItemKeys, item_keys, items_registry
from seckill.engine.scripts import ScriptName, Scripts

Clock = Callable[[], int]
"""Epoch milliseconds. The engine's default is no clock at all: the scripts read Redis TIME."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``requests`` purchase attempts per buyer and item in ``window_ms``.

    A fixed window that opens at the buyer's first counted attempt (not at a clock boundary, so
    refused buyers do not all come back at the same instant). Counted inside the reserve script:
    every attempt that passed validation and is not a replay of a recorded idempotency key.
    """

    requests: int
    window_ms: int

    def __post_init__(self) -> None:
        rules.check_rate_limit(requests=self.requests, window_ms=self.window_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemSnapshot:
    """One item's whole Redis state, read in one MULTI/EXEC: nothing moved in between.

    ``events`` is the stream as it stood (everything not yet trimmed, which includes every entry
    not yet landed); ``last_event_id`` the stream's last generated id ("0-0": no stream), the
    position this snapshot is as of. ``now_ms``: the item's server's clock read just before.
    O(holds + stream): for audits and the reconciler.
    """

    item_id: int
    item: SaleItem | None
    stock: Stock | None
    holds: dict[int, Hold]
    buyers: dict[str, int]
    deadlines: dict[int, int]
    events: list[tuple[str, dict[str, str]]]
    last_event_id: str
    now_ms: int


class RecoveredOrder(NamedTuple):
    """One order as SQL records it, in the shape recover.lua takes (the id as a string: Lua
    numbers are doubles)."""

    order_id: str
    buyer: str
    quantity: int
    status: str
    deadline_ms: int  # 0 when the record has none (only held orders need one)
    reason: str | None


@dataclass(frozen=True, slots=True)
class Recovery:
    restored: int  # holds created from SQL
    advanced: int  # holds moved forward to SQL's state
    conflicts: int  # orders where Redis and SQL went different ways (SQL kept)
    stock: Stock


_REPAIR_BATCH = 1_000
_ITEM_FIELDS = ("total", "starts_at_ms", "ends_at_ms", "per_buyer_limit", "hold_ms")


async def registered_items(redis: RedisClient, prefix: str = DEFAULT_PREFIX) -> list[int]:
    """Every item ever loaded, ascending: the one read of the items registry, for a worker that
    holds a connection rather than an engine (others ask ``RedisEngine.item_ids``)."""
    members = cast(set[str], await redis.smembers(items_registry(prefix)))
    return sorted(int(m) for m in members)


class RedisEngine:
    """Sells items held in one Redis (or one cluster slot per item).

    ``clock`` exists for tests and simulations that need to move time; in production leave it
    unset so every decision uses the one clock all processes share: Redis's own.
    ``rate_limit``: purchase attempts per buyer and item (None: unlimited); the rate windows
    follow the same clock.
    With a pipeliner in ``scripts``, the one read on the purchase path (``recorded``) is batched
    with the scripts' calls.
    """

    def __init__(
        self,
        redis: RedisClient,
        *,
        scripts: Scripts,
        idempotency_ttl_ms: int,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self._redis = redis
        self._scripts = scripts
        self._idempotency_ttl = str(idempotency_ttl_ms)
        self._prefix = prefix
        self._clock = clock
        self._rate_args = (
            ("", "")
            if rate_limit is None
            else (str(rate_limit.requests), str(rate_limit.window_ms))
        )

    @property
    def redis(self) -> RedisClient:
        return self._redis

    @property
    def scripts(self) -> Scripts:
        """The scripts this engine calls (bootstrap's: the pipeliner and the durability set)."""
        return self._scripts

    @property
    def prefix(self) -> str:
        return self._prefix

    def keys(self, item_id: int) -> ItemKeys:
        return item_keys(item_id, self._prefix)

    async def item_ids(self) -> list[int]:
        """Every item ever loaded into this Redis, ascending (the items registry)."""
        return await registered_items(self._redis, self._prefix)

    async def item_count(self) -> int:
        """How many items the registry holds, without reading them."""
        return int(await self._redis.scard(items_registry(self._prefix)))

    def _now(self) -> str:
        return "" if self._clock is None else str(self._clock())

    async def _call(
        self, name: ScriptName, item_id: int, *args: Any, extra_keys: tuple[str, ...] = ()
    ) -> Any:
        keys = (*self.keys(item_id).all_fixed(), *extra_keys)
        return await self._scripts.call(name, keys, (item_id, *args))

    async def load_item(self, item: SaleItem, *, force: bool = False) -> Outcome:
        """Put an item on sale, or change its settings.

        An item with holds or sales is refused (``item_active``) unless ``force``; even then its
        held and sold units are kept and only ``available`` follows the new total.
        """
        # Registered first (it lives outside the item's slot): a worker may then find a stream
        # that has no entry yet, but never miss one that has.
        await self._redis.sadd(items_registry(self._prefix), item.item_id)
        reply = await self._call(
            ScriptName.LOAD_ITEM,
            item.item_id,
            item.total,
            item.starts_at_ms,
            item.ends_at_ms,
            item.per_buyer_limit,
            item.hold_ms,
            "1" if force else "0",
            self._now(),
        )
        return Outcome(reply[0])

    async def reserve(
        self,
        item_id: int,
        *,
        buyer: str,
        quantity: int,
        idempotency_key: str,
        order_id: int,
        request_id: str = "",
    ) -> Reservation:
        """Try to hold ``quantity`` units for ``buyer``: one round trip, decided atomically.

        With a rate limit, an attempt past it answers ``rate_limited`` with ``retry_after_ms``
        and changes nothing; a replay of a recorded key is answered before the limit, uncounted.
        """
        rules.check_item_id(item_id)
        rules.check_buyer(buyer)
        rules.check_quantity(quantity)
        rules.check_idempotency_key(idempotency_key)
        rules.check_order_id(order_id)
        rules.check_request_id(request_id)
        keys = self.keys(item_id)
        reply = await self._call(
            ScriptName.RESERVE,
            item_id,
            buyer,
            quantity,
            order_id,
            self._idempotency_ttl,
            self._now(),
            *self._rate_args,
            request_id,
            extra_keys=(keys.idempotency(buyer, idempotency_key), keys.rate(buyer)),
        )
        code = Outcome(reply[0])
        if len(reply) == 1:
            return Reservation(code)
        if code is Outcome.RATE_LIMITED:
            return Reservation(code, retry_after_ms=int(reply[1]))
        replayed = code is not Outcome.RESERVED
        outcome = Outcome.RESERVED if code is Outcome.REPLAY else code
        return Reservation(outcome, int(reply[1]), int(reply[2]), replayed=replayed)

    async def recorded(
        self, item_id: int, *, buyer: str, quantity: int, idempotency_key: str
    ) -> Reservation | None:
        """The answer recorded under this key by an earlier reservation, or None: one GET, no
        script, no write. For a process that knows the item is sold out and must still give a
        repeat its first answer (the script's replay / key_reused rule, read-only)."""
        rules.check_item_id(item_id)
        rules.check_buyer(buyer)
        rules.check_quantity(quantity)
        rules.check_idempotency_key(idempotency_key)
        key = self.keys(item_id).idempotency(buyer, idempotency_key)
        pipeliner = self._scripts.pipeliner
        if pipeliner is None:
            raw = await self._redis.get(key)
        else:  # it runs on every request for a sold-out item: batched like the scripts
            raw = await pipeliner.execute("GET", key)
        if raw is None:
            return None
        first = json.loads(raw)
        outcome = Outcome.RESERVED if int(first["quantity"]) == quantity else Outcome.KEY_REUSED
        return Reservation(
            outcome, int(first["order_id"]), int(first["deadline_ms"]), replayed=True
        )

    async def confirm(self, item_id: int, order_id: int) -> HoldTransition:
        """A payment succeeded: held -> paid. Idempotent.

        A hold released before the payment, or found at or past its deadline (then released as
        expired), answers ``refund_required`` with the release reason: its stock is never sold
        after all. The first such payment marks the hold and journals a ``refund_required``
        event; later ones change nothing.
        """
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        return _transition(await self._call(ScriptName.CONFIRM, item_id, order_id, self._now()))

    async def release(self, item_id: int, order_id: int, reason: ReleaseReason) -> HoldTransition:
        """Give a hold's stock back. Idempotent; a paid hold refuses (``already_paid``)."""
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        reason = ReleaseReason(reason)
        return _transition(
            await self._call(ScriptName.RELEASE, item_id, order_id, reason.value, self._now())
        )

    async def settle_payment(
        self, item_id: int, order_id: int, *, payment_id: str, succeeded: bool
    ) -> PaymentSettlement:
        """Apply a payment provider's notice once per ``payment_id``.

        Succeeded: as :meth:`confirm`. Failed: held -> released (``payment_failed``); a paid hold
        stays paid (``already_paid``). A payment id seen before answers what it answered then
        (``replayed``), or refuses with ``payment_id_reused`` if it now names another order or
        result. An unknown order answers ``unknown_order`` and is not recorded.
        """
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        rules.check_payment_id(payment_id)
        rules.check_payment_result(succeeded)
        reply = await self._call(
            ScriptName.SETTLE_PAYMENT,
            item_id,
            order_id,
            payment_id,
            "succeeded" if succeeded else "failed",
            self._now(),
            extra_keys=(self.keys(item_id).payments,),
        )
        if Outcome(reply[0]) is Outcome.REPLAY:
            return PaymentSettlement(Outcome(reply[1]), _reason(reply, 2), replayed=True)
        return PaymentSettlement(Outcome(reply[0]), _reason(reply, 1))

    async def expire_due(self, item_id: int, *, limit: int = 500) -> list[int]:
        """Release at most ``limit`` holds past their deadline; returns their order ids."""
        rules.check_item_id(item_id)
        rules.check_batch(limit)
        reply = await self._call(ScriptName.EXPIRE_DUE, item_id, self._now(), limit)
        return [int(order_id) for order_id in reply]

    # -- the reconciler's repairs (operator actions, O(holds); never on the purchase path) --------

    async def replay_holds(
        self, item_id: int, orders: Sequence[tuple[int, str | None]]
    ) -> list[int]:
        """Append again the events that take each order from its status in SQL (None: SQL has
        no such order) to where its hold now stands; returns the orders journaled. Unknown
        order ids are skipped."""
        for order_id, _ in orders:
            rules.check_order_id(order_id)
        replayed: list[int] = []
        for start in range(0, len(orders), _REPAIR_BATCH):
            args = [
                value
                for order_id, in_sql in orders[start : start + _REPAIR_BATCH]
                for value in (order_id, in_sql or "")
            ]
            reply = await self._call(ScriptName.REPLAY_HOLDS, item_id, self._now(), *args)
            replayed += [int(order_id) for order_id in reply]
        return replayed

    async def recount(self, item_id: int) -> Stock | None:
        """Set the counters, buyers' units and deadline index from the holds (see recount.lua);
        the counters as they now stand, or None for an item not loaded."""
        reply = await self._call(ScriptName.RECOUNT, item_id)
        if Outcome(reply[0]) is Outcome.UNKNOWN_ITEM:
            return None
        available, held, sold = (int(n) for n in reply[1:4])
        return Stock(available + held + sold, available, held, sold)

    async def recover(
        self, item: SaleItem, *, last_landed_id: str, orders: Sequence[RecoveredOrder]
    ) -> Recovery:
        """Rebuild the item from SQL's record merged with what Redis still holds (recover.lua)."""
        await self._redis.sadd(items_registry(self._prefix), item.item_id)  # as load_item does
        reply = await self._call(
            ScriptName.RECOVER,
            item.item_id,
            item.total,
            item.starts_at_ms,
            item.ends_at_ms,
            item.per_buyer_limit,
            item.hold_ms,
            self._now(),
            last_landed_id,
            json.dumps([list(order) for order in orders]),
        )
        restored, advanced, conflicts, available, held, sold = (int(n) for n in reply[1:7])
        return Recovery(restored, advanced, conflicts, Stock(item.total, available, held, sold))

    # redis-py types its replies loosely (bytes | str, sync | async); the client here always
    # decodes, so the reads below state the shapes they get.

    async def item(self, item_id: int) -> SaleItem | None:
        """The item's sale settings as loaded, or None."""
        values = await self._hmget(self.keys(item_id).item, _ITEM_FIELDS)
        if values is None:
            return None
        return SaleItem(item_id=item_id, **dict(zip(_ITEM_FIELDS, values, strict=True)))

    async def stock(self, item_id: int) -> Stock | None:
        """The item's counters, read in one command (so they are consistent), or None."""
        values = await self._hmget(self.keys(item_id).item, STOCK_FIELDS)
        return None if values is None else Stock(*values)

    async def hold(self, item_id: int, order_id: int) -> Hold | None:
        raw = cast(str | None, await self._redis.hget(self.keys(item_id).holds, str(order_id)))
        return None if raw is None else _hold(order_id, raw)

    async def holds(self, item_id: int) -> dict[int, Hold]:
        """Every hold of an item, in any state (for audits and tests; O(holds))."""
        raw = cast(dict[str, str], await self._redis.hgetall(self.keys(item_id).holds))
        return {int(k): _hold(int(k), v) for k, v in raw.items()}

    async def events(self, item_id: int) -> list[tuple[str, dict[str, str]]]:
        """The item's whole journal, oldest first (for audits and tests; O(events))."""
        key, start = self.keys(item_id).events, "-"
        out: list[tuple[str, dict[str, str]]] = []
        while True:
            page = cast(
                list[tuple[str, dict[str, str]]],
                await self._redis.xrange(key, min=start, count=10_000),
            )
            out.extend(page)
            if len(page) < 10_000:
                return out
            start = "(" + page[-1][0]

    async def deadlines(self, item_id: int) -> dict[int, int]:
        """Held order ids and their deadlines (ms), from the expiry index."""
        raw = cast(
            list[tuple[str, float]],
            await self._redis.zrange(self.keys(item_id).deadlines, 0, -1, withscores=True),
        )
        return {int(order_id): int(score) for order_id, score in raw}

    async def buyer_units(self, item_id: int) -> dict[str, int]:
        """Units held or paid per buyer (buyers at zero are not listed)."""
        raw = cast(dict[str, str], await self._redis.hgetall(self.keys(item_id).buyers))
        return {buyer: int(units) for buyer, units in raw.items()}

    async def snapshot(self, item_id: int) -> ItemSnapshot:
        keys = self.keys(item_id)
        # Read just before the transaction, on the item's own server (a cluster refuses TIME in
        # a transaction of one slot): a lower bound of the snapshot's instant, so a hold is
        # never judged overdue early.
        now_ms = await time_ms(self._redis, keys.item)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.hgetall(keys.item)
            tx.hgetall(keys.holds)
            tx.hgetall(keys.buyers)
            tx.zrange(keys.deadlines, 0, -1, withscores=True)
            tx.xrange(keys.events)
            tx.xinfo_stream(keys.events)
            item, holds, buyers, deadlines, events, stream = await tx.execute(raise_on_error=False)
        if isinstance(stream, ResponseError):  # no such key: the stream was never written
            stream = {"last-generated-id": "0-0"}
        for reply in (item, holds, buyers, deadlines, events):
            if isinstance(reply, Exception):
                raise reply
        item = cast(dict[str, str], item)
        complete = all(f in item for f in _ITEM_FIELDS)
        return ItemSnapshot(
            item_id=item_id,
            item=SaleItem(item_id=item_id, **{f: int(item[f]) for f in _ITEM_FIELDS})
            if complete
            else None,
            stock=Stock(*(int(item[f]) for f in STOCK_FIELDS)) if complete else None,
            holds={int(k): _hold(int(k), v) for k, v in cast(dict[str, str], holds).items()},
            buyers={b: int(n) for b, n in cast(dict[str, str], buyers).items()},
            deadlines={int(o): int(score) for o, score in deadlines},
            events=cast(list[tuple[str, dict[str, str]]], events),
            last_event_id=str(stream["last-generated-id"]),
            now_ms=now_ms,
        )

    async def last_event_id(self, item_id: int) -> str:
        """The last id the item's stream generated ("0-0": no stream)."""
        try:
            info = await self._redis.xinfo_stream(self.keys(item_id).events)
        except ResponseError:  # no such key
            return "0-0"
        return str(info["last-generated-id"])

    async def _hmget(self, key: str, fields: tuple[str, ...]) -> list[int] | None:
        values = cast(list[str | None], await self._redis.hmget(key, list(fields)))
        if any(v is None for v in values):
            return None
        return [int(v) for v in values if v is not None]


def _reason(reply: list[Any], at: int) -> ReleaseReason | None:
    return ReleaseReason(reply[at]) if len(reply) > at else None


def _transition(reply: list[Any]) -> HoldTransition:
    return HoldTransition(Outcome(reply[0]), _reason(reply, 1))


def _hold(order_id: int, raw: str) -> Hold:
    record = json.loads(raw)
    return Hold(
        order_id=order_id,
        buyer=record["buyer"],
        quantity=int(record["quantity"]),
        deadline_ms=int(record["deadline_ms"]),
        state=HoldState(record["state"]),
        reason=ReleaseReason(record["reason"]) if "reason" in record else None,
        refund_required=record.get("refund_required") is True,
    )
