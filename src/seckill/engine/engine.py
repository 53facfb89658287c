"""The Redis engine: plain async functions that decide and move stock, one script call each.

No framework types here, so any route, worker or benchmark can call it directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from redis.exceptions import ResponseError

from seckill.domain import rules
from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.holds import (
    Hold,
    HoldState,
    HoldTransition,
    PaymentSettlement,
    Reservation,
)
from seckill.domain.items import STOCK_FIELDS, SaleItem, Stock
from seckill.domain.lifecycle import Unsettled
from seckill.domain.outcomes import Outcome
from seckill.domain.shards import home_shard, split_stock
from seckill.engine.cluster import RedisClient, time_ms
from seckill.engine.keys import (
    DEFAULT_PREFIX,
    ItemKeys,
    item_card_keys,
    item_keys,
    items_registry,
    queue_keys,
    queues_registry,
)
from seckill.engine.scripts import ScriptName, Scripts

Clock = Callable[[], int]
"""Epoch milliseconds. The engine's default is no clock at all: the scripts read Redis TIME."""


Transfers = dict[str, dict[str, int]]
"""A shard's transfer records: "out:<id>" / "in:<id>" -> {units, the other shard, at_ms}."""


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
    shard: int = 0
    shards: int = 1  # the item's shard count (this snapshot is of one of them)
    transfers: Transfers = field(default_factory=dict)  # see ItemKeys.transfers
    # payment id -> its record (settle_payment.lua), JSON decoded: the notices this shard settled
    # and, on the head, the claims made for other shards.
    payments: dict[str, dict[str, Any]] = field(default_factory=dict)
    run: str = ""  # the run id the shard was verified under ("fenced:<why>" when fenced)
    fenced: bool = False  # not verified under this server's run: it sells nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRemains:
    """What archiving a shard moves to SQL first, as one read: the payment notices it recorded
    (payment id -> the answer, JSON decoded) and its dead letters (each a sink gave up on),
    as of its stream's ``last_event_id``."""

    last_event_id: str
    payments: dict[str, dict[str, Any]]
    dead_letters: list[tuple[str, dict[str, str]]]


class RecoveredOrder(NamedTuple):
    """One order as SQL records it, in the shape recover.lua takes (the id as a string: Lua
    numbers are doubles)."""

    order_id: str
    buyer: str
    quantity: int
    status: str
    deadline_ms: int  # 0 when the record has none (only held orders need one)
    reason: str | None
    payment_id: str | None  # a paid order's payment


class RecoveredPayment(NamedTuple):
    """A successful payment as SQL records it (a paid order's payment, or a refund owed), in the
    shape recover.lua takes."""

    payment_id: str
    order_id: str
    outcome: str  # paid or refund_required
    reason: str | None  # a refund's


@dataclass(frozen=True, slots=True)
class Recovery:
    restored: int  # holds created from SQL
    advanced: int  # holds moved forward to SQL's state
    conflicts: int  # orders where Redis and SQL went different ways (SQL kept)
    stock: Stock


_REPAIR_BATCH = 1_000
RESTORE_BATCH = 500  # events put back per script call: each call blocks its node meanwhile
_ITEM_FIELDS = ("total", "starts_at_ms", "ends_at_ms", "per_buyer_limit", "hold_ms")
_SHARD_FIELDS = ("shards", "item_total")  # on a shard, the item's count and total
_SHORT = frozenset({Outcome.SOLD_OUT, Outcome.INSUFFICIENT_STOCK})

# A purchase whose home shard is short takes the units it needs from the fullest other shards,
# then asks its home again. Another buyer of the same home may take them first (and bought
# them): then it goes again, until a round finds no other shard with any, or after this many
# rounds (a bound against livelock; each lost round was a unit sold to someone else).
TRANSFER_ROUNDS = 16
# A transfer still in transit this long after it was sent is delivered by the reaper: its sender
# stopped between the two halves (usually it delivers within the same request).
TRANSIT_GRACE_MS = 1_000


class ShardCounts:
    """Each item's stock shard count, read from the item's head once per process: it never
    changes once the item is loaded (load_item refuses another)."""

    def __init__(self, redis: RedisClient, prefix: str = DEFAULT_PREFIX) -> None:
        self._redis = redis
        self._prefix = prefix
        self._known: dict[int, int] = {}

    def known(self, item_id: int) -> int | None:
        """The item's shard count if already read: the purchase path's way, no coroutine."""
        return self._known.get(item_id)

    async def of(self, item_id: int) -> int:
        """The item's shard count; 1 for an item not loaded (not remembered: it may be loaded
        with shards later)."""
        known = self._known.get(item_id)
        if known is not None:
            return known
        head = item_keys(item_id, self._prefix).item
        shards, total = cast(list[str | None], await self._redis.hmget(head, ["shards", "total"]))
        if total is None:
            return 1
        self._known[item_id] = count = int(shards or 1)
        return count

    def learn(self, item_id: int, shards: int) -> None:
        self._known[item_id] = shards

    def forget(self, item_id: int) -> None:
        """The item left Redis (archived): read it again should it ever come back."""
        self._known.pop(item_id, None)


def combined_stock(item_total: int, parts: Sequence[tuple[Stock, Transfers]]) -> Stock:
    """One item's stock from its shards' counters and transfer records, each pair read at once
    on its shard (the shards at different instants).

    A transfer moves ``available`` only, so the shards are put on one cut by their records:
    units sent and not (yet, as read) received are in transit, still the item's available; units
    read as received on a shard whose sender was read before sending are counted there only.
    """
    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    for _, transfers in parts:
        for name, record in transfers.items():
            side, _, transfer_id = name.partition(":")
            (sent if side == "out" else received)[transfer_id] = record["units"]
    in_transit = sum(units for t, units in sent.items() if t not in received)
    counted_twice = sum(units for t, units in received.items() if t not in sent)
    return Stock(
        item_total,
        sum(stock.available for stock, _ in parts) + in_transit - counted_twice,
        sum(stock.held for stock, _ in parts),
        sum(stock.sold for stock, _ in parts),
    )


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
            None if rate_limit is None else (str(rate_limit.requests), str(rate_limit.window_ms))
        )
        self._shard_counts = ShardCounts(redis, prefix)

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

    @property
    def idempotency_ttl_ms(self) -> int:
        """How long a purchase's idempotency record is kept."""
        return int(self._idempotency_ttl)

    def keys(self, item_id: int, shard: int = 0) -> ItemKeys:
        """The keys of an item's shard (shard 0: the item's own, all of an unsharded item's)."""
        return item_keys(item_id, self._prefix, shard)

    async def shard_count(self, item_id: int) -> int:
        """How many stock shards the item has (1 for an item not loaded)."""
        return await self._shard_counts.of(item_id)

    async def shard_keys(self, item_id: int) -> list[ItemKeys]:
        """The keys of every shard of the item, shard 0 first."""
        return [self.keys(item_id, s) for s in range(await self.shard_count(item_id))]

    async def item_ids(self) -> list[int]:
        """Every item ever loaded into this Redis, ascending (the items registry)."""
        return await registered_items(self._redis, self._prefix)

    async def item_count(self) -> int:
        """How many items the registry holds, without reading them."""
        return int(await self._redis.scard(items_registry(self._prefix)))

    def now_arg(self) -> str:
        """The "now" argument of a script: this engine's clock, or "" for Redis TIME."""
        return "" if self._clock is None else str(self._clock())

    async def _call(
        self,
        name: ScriptName,
        item_id: int,
        *args: Any,
        extra_keys: tuple[str, ...] = (),
        shard: int = 0,
    ) -> Any:
        keys = (*self.keys(item_id, shard).all_fixed(), *extra_keys)
        return await self._scripts.call(name, keys, (item_id, *args))

    async def execute(self, *command: Any) -> Any:
        """One keyed command, batched with the scripts' calls when there is a pipeliner."""
        pipeliner = self._scripts.pipeliner
        if pipeliner is None:
            return await self._redis.execute_command(*command)
        return await pipeliner.execute(*command)

    async def load_item(self, item: SaleItem, *, force: bool = False) -> Outcome:
        """Put an item on sale, or change its settings.

        An item with holds or sales is refused (``item_active``) unless ``force``; even then its
        held and sold units are kept and only ``available`` follows the new total.
        With stock shards, each shard opens with its share of the total; once loaded, the shard
        count and the total are fixed (``stock_shards_fixed``) and a load changes the settings.
        """
        # Registered first (it lives outside the item's slot): a worker may then find a stream
        # that has no entry yet, but never miss one that has.
        await self._redis.sadd(items_registry(self._prefix), item.item_id)
        shards = item.stock_shards
        if shards > 1 and not force:
            # Every shard is asked before any changes, so settings never differ between shards
            # because one shard was active and refused.
            for shard in range(shards):
                held_sold = await self._hmget(self.keys(item.item_id, shard).item, ("held", "sold"))
                if held_sold and any(held_sold):
                    await self._load_shard(item, shard, 0, force=False)  # raises item_active
        codes = [
            await self._load_shard(item, shard, share, force=force)
            for shard, share in enumerate(split_stock(item.total, shards))
        ]
        self._shard_counts.learn(item.item_id, shards)
        return Outcome.RELOADED if Outcome.RELOADED in codes else codes[0]

    async def _load_shard(self, item: SaleItem, shard: int, share: int, *, force: bool) -> Outcome:
        reply = await self._call(
            ScriptName.LOAD_ITEM,
            item.item_id,
            share,
            item.starts_at_ms,
            item.ends_at_ms,
            item.per_buyer_limit,
            item.hold_ms,
            "1" if force else "0",
            self.now_arg(),
            item.stock_shards,
            item.total,
            shard=shard,
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

        With stock shards, the buyer's home shard decides. If it is short, stock is taken from
        the other shards (see ``_take_stock``) and the home asks again, up to ``TRANSFER_ROUNDS``
        times: ``sold_out`` then means every other shard answered that it had nothing left.
        With a rate limit, an attempt past it answers ``rate_limited`` with ``retry_after_ms``
        and changes nothing; a replay of a recorded key is answered before the limit, uncounted.
        """
        rules.check_item_id(item_id)
        rules.check_buyer(buyer)
        rules.check_quantity(quantity)
        rules.check_idempotency_key(idempotency_key)
        rules.check_order_id(order_id)
        rules.check_request_id(request_id)
        shards = self._shard_counts.known(item_id) or await self._shard_counts.of(item_id)
        home = home_shard(buyer, shards)
        keys = self.keys(item_id, home)
        script_keys = (*keys.all_fixed(), keys.idempotency(buyer, idempotency_key))
        if self._rate_args is not None:
            script_keys = (*script_keys, keys.rate(buyer))
        args = (item_id, buyer, quantity, order_id, self._idempotency_ttl)
        reply = await self._scripts.call(
            ScriptName.RESERVE,
            script_keys,
            (*args, self.now_arg(), *_reserve_options(self._rate_args, request_id),
             idempotency_key),
        )  # fmt: skip
        transfer = 0
        while shards > 1 and transfer < TRANSFER_ROUNDS and _OUTCOMES[reply[0]] in _SHORT:
            transfer += 1
            moved = await self._take_stock(
                item_id, to=home, need=quantity, transfer_id=f"{order_id}.{transfer}",
                shards=shards,
            )  # fmt: skip
            if not moved:
                break  # every other shard answered that it had nothing left
            # The same attempt asked again: not counted against the rate limit a second time.
            reply = await self._scripts.call(
                ScriptName.RESERVE,
                script_keys,
                (*args, self.now_arg(), *_reserve_options(None, request_id), idempotency_key),
            )
        return _reservation(reply)

    async def _take_stock(
        self, item_id: int, *, to: int, need: int, transfer_id: str, shards: int
    ) -> int:
        """Move ``need`` units to shard ``to`` from the other shards, fullest first, as far as
        they have any; returns the units moved (0: each had none when asked)."""
        others = [shard for shard in range(shards) if shard != to]
        available = await asyncio.gather(
            *(self.execute("HGET", self.keys(item_id, s).item, "available") for s in others)
        )
        donors = sorted(
            ((int(a), s) for a, s in zip(available, others, strict=True) if a and int(a) > 0),
            reverse=True,
        )
        moved = 0
        for _, donor in donors:
            units = await self.transfer(
                item_id, source=donor, to=to, need=need - moved,
                transfer_id=f"{transfer_id}.{donor}",
            )  # fmt: skip
            moved += units
            if moved >= need:
                break
        return moved

    async def transfer(
        self, item_id: int, *, source: int, to: int, need: int, transfer_id: str
    ) -> int:
        """Move stock from shard ``source`` to shard ``to``: ``need`` units, or all the source
        has if that is less (see transfer_out.lua); returns the units moved. Idempotent
        per ``transfer_id``. If the second half fails, the units stay in transit until
        :meth:`deliver_in_transit` (the reaper) delivers them."""
        sent = self.keys(item_id, source)
        reply = await self._call(
            ScriptName.TRANSFER_OUT, item_id, transfer_id, to, need, self.now_arg(),
            extra_keys=(sent.transfers, sent.in_transit), shard=source,
        )  # fmt: skip
        if Outcome(reply[0]) not in (Outcome.TRANSFERRED, Outcome.REPLAY):
            return 0
        units = int(reply[1])
        await self._deliver(item_id, source=source, to=to, transfer_id=transfer_id, units=units)
        return units

    async def _deliver(
        self, item_id: int, *, source: int, to: int, transfer_id: str, units: int
    ) -> None:
        reply = await self._call(
            ScriptName.TRANSFER_IN, item_id, transfer_id, source, units, self.now_arg(),
            extra_keys=(self.keys(item_id, to).transfers,), shard=to,
        )  # fmt: skip
        if Outcome(reply[0]) in (Outcome.TRANSFERRED, Outcome.REPLAY):
            # Delivered; else (a fenced receiver) it stays in transit for the reaper.
            await self._redis.zrem(self.keys(item_id, source).in_transit, transfer_id)

    async def deliver_in_transit(self, item_id: int, shard: int, *, limit: int = 100) -> int:
        """Deliver the transfers shard ``shard`` sent more than ``TRANSIT_GRACE_MS`` ago that are
        still in transit (their sender stopped between the halves); returns how many."""
        keys = self.keys(item_id, shard)
        now = await time_ms(self._redis, keys.item) if self._clock is None else self._clock()
        due = cast(
            list[str],
            await self._redis.zrangebyscore(
                keys.in_transit, "-inf", now - TRANSIT_GRACE_MS, start=0, num=limit
            ),
        )
        for transfer_id in due:
            raw = cast(str | None, await self._redis.hget(keys.transfers, f"out:{transfer_id}"))
            if raw is None:  # not a transfer this shard sent: nothing to deliver
                await self._redis.zrem(keys.in_transit, transfer_id)
                continue
            record = json.loads(raw)
            await self._deliver(
                item_id, source=shard, to=int(record["to"]), transfer_id=transfer_id,
                units=int(record["units"]),
            )  # fmt: skip
        return len(due)

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
        home = home_shard(buyer, await self._shard_counts.of(item_id))
        # It runs on every request for a sold-out item: batched like the scripts.
        raw = await self.execute(
            "GET", self.keys(item_id, home).idempotency(buyer, idempotency_key)
        )
        if raw is None:
            return None
        first = json.loads(raw)
        outcome = Outcome.RESERVED if int(first["quantity"]) == quantity else Outcome.KEY_REUSED
        return Reservation(
            outcome, int(first["order_id"]), int(first["deadline_ms"]), replayed=True
        )

    async def release(self, item_id: int, order_id: int, reason: ReleaseReason) -> HoldTransition:
        """Give a hold's stock back. Idempotent; a paid hold refuses (``already_paid``)."""
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        reason = ReleaseReason(reason)
        shard = await self.order_shard(item_id, order_id)
        return _transition(
            await self._call(
                ScriptName.RELEASE, item_id, order_id, reason.value, self.now_arg(), shard=shard
            )
        )

    async def settle_payment(
        self, item_id: int, order_id: int, *, payment_id: str, succeeded: bool
    ) -> PaymentSettlement:
        """Apply a payment provider's notice once per ``payment_id``, which names one payment of
        the item (see settle_payment.lua).

        Succeeded: held -> paid; a success for an order already released, or paid by another
        payment, answers ``refund_required`` and journals a refund owed for this payment.
        Failed: held -> released (``payment_failed``); a paid hold stays paid
        (``already_paid``). A payment id seen before answers what it answered then
        (``replayed``), or refuses with ``payment_id_reused`` if it now names another order or
        result, whatever the shards. An unknown order answers ``unknown_order`` and is not
        recorded.
        """
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        rules.check_payment_id(payment_id)
        rules.check_payment_result(succeeded)
        notice = (order_id, payment_id, "succeeded" if succeeded else "failed")
        shard = await self.order_shard(item_id, order_id)
        if shard:  # the item's head keeps every payment id it has seen: claimed there first
            claim = await self._call(
                ScriptName.CLAIM_PAYMENT, item_id, *notice, shard,
                extra_keys=(self.keys(item_id).payments,),
            )  # fmt: skip
            if claim[0] == Outcome.ITEM_RECOVERING:
                return PaymentSettlement(Outcome.ITEM_RECOVERING)
            shard = int(claim[1])
        reply = await self._settle(item_id, shard, notice)
        if reply[0] == Outcome.CLAIMED:  # the order left its shard (archived) since the claim
            reply = await self._settle(item_id, int(reply[1]), notice)
        if reply[0] == Outcome.REPLAY:
            return _settlement(reply[1:], replayed=True)
        return _settlement(reply)

    async def _settle(self, item_id: int, shard: int, notice: tuple[int, str, str]) -> Any:
        return await self._call(
            ScriptName.SETTLE_PAYMENT, item_id, *notice, self.now_arg(),
            extra_keys=(self.keys(item_id, shard).payments,), shard=shard,
        )  # fmt: skip

    async def expire_due(self, item_id: int, *, limit: int = 500, shard: int = 0) -> list[int]:
        """Release at most ``limit`` holds of one shard past their deadline; returns their order
        ids."""
        rules.check_item_id(item_id)
        rules.check_batch(limit)
        reply = await self._call(ScriptName.EXPIRE_DUE, item_id, self.now_arg(), limit, shard=shard)
        return [int(order_id) for order_id in reply]

    async def order_shard(self, item_id: int, order_id: int) -> int:
        """The shard holding an order (its buyer's home); 0 when no shard knows it, where the
        scripts answer ``unknown_order``. Holds never move, so the answer stays true."""
        shards = await self._shard_counts.of(item_id)
        if shards == 1:
            return 0
        found = await asyncio.gather(
            *(self.execute("HEXISTS", self.keys(item_id, s).holds, order_id) for s in range(shards))
        )
        return next((s for s in range(shards) if found[s]), 0)

    # -- the fence (see live_run in _common.lua) ---------------------------------------------

    async def fence(self, item_id: int, shard: int, why: str) -> Outcome:
        """Fence a stock shard found behind SQL: it sells nothing until verified again."""
        reply = await self._call(ScriptName.FENCE, item_id, "fence", "", why, shard=shard)
        return Outcome(reply[0])

    async def fenced_items(self, item_ids: Sequence[int]) -> list[int]:
        """Of ``item_ids``, those with a fenced shard (loaded, not verified under its server's
        run): one small script per shard, sent together (one round trip per node)."""
        shards = [(i, s) for i in item_ids for s in range(await self.shard_count(i))]
        replies = await asyncio.gather(
            *(
                self._scripts.call(ScriptName.TERMS, self.keys(i, s).all_fixed(), (i,))
                for i, s in shards
            )
        )
        return sorted({i for (i, _), reply in zip(shards, replies, strict=True) if reply[-1] == 1})

    async def verify(self, item_id: int, shard: int, *, seen_run: str) -> Outcome:
        """Lift a shard's fence once verified against SQL: ``verified``, or ``moved`` if its
        ``run`` is no longer ``seen_run`` (fenced again meanwhile: it stays fenced)."""
        reply = await self._call(ScriptName.FENCE, item_id, "verify", seen_run, "", shard=shard)
        return Outcome(reply[0])

    # -- the reconciler's repairs (operator actions, O(holds); never on the purchase path) --------

    async def replay_holds(
        self, item_id: int, orders: Sequence[tuple[int, str | None]]
    ) -> list[int]:
        """Append again the events that take each order from its status in SQL (None: SQL has
        no such order) to where its hold now stands, each on its shard; returns the orders
        journaled. Unknown order ids are skipped."""
        for order_id, _ in orders:
            rules.check_order_id(order_id)
        by_shard: dict[int, list[tuple[int, str | None]]] = {}
        for order in orders:
            by_shard.setdefault(await self.order_shard(item_id, order[0]), []).append(order)
        replayed: list[int] = []
        for shard, own in sorted(by_shard.items()):
            for start in range(0, len(own), _REPAIR_BATCH):
                args = [
                    value
                    for order_id, in_sql in own[start : start + _REPAIR_BATCH]
                    for value in (order_id, in_sql or "")
                ]
                reply = await self._call(
                    ScriptName.REPLAY_HOLDS, item_id, self.now_arg(), *args, shard=shard
                )
                replayed += [int(order_id) for order_id in reply]
        return replayed

    async def replay_refunds(
        self, item_id: int, shard: int, payment_ids: Sequence[str]
    ) -> list[str]:
        """Journal again the refunds owed under ``payment_ids`` on one shard, from their records
        (replay_refunds.lua); returns the payment ids journaled."""
        for payment_id in payment_ids:
            rules.check_payment_id(payment_id)
        replayed: list[str] = []
        for start in range(0, len(payment_ids), _REPAIR_BATCH):
            replayed += await self._call(
                ScriptName.REPLAY_REFUNDS, item_id, self.now_arg(),
                *payment_ids[start : start + _REPAIR_BATCH],
                extra_keys=(self.keys(item_id, shard).payments,), shard=shard,
            )  # fmt: skip
        return replayed

    async def recount(self, item_id: int, shard: int = 0) -> Stock | None:
        """Set a shard's counters, buyers' units and deadline index from its holds (see
        recount.lua); the counters as they now stand, or None for a shard not loaded."""
        reply = await self._call(ScriptName.RECOUNT, item_id, shard=shard)
        if Outcome(reply[0]) is Outcome.UNKNOWN_ITEM:
            return None
        available, held, sold = (int(n) for n in reply[1:4])
        return Stock(available + held + sold, available, held, sold)

    async def recover(
        self,
        item: SaleItem,
        *,
        last_landed_id: str,
        orders: Sequence[RecoveredOrder],
        payments: Sequence[RecoveredPayment] = (),
        shard: int = 0,
        total: int | None = None,
        plan: bool = False,
    ) -> Recovery:
        """Rebuild one shard (an unsharded item's only one) from SQL's record merged with what
        Redis still holds, record again the payments SQL knows, and lift the shard's fence
        (recover.lua). ``total``: the shard's (default: the item's). ``plan``: only say what the
        merge would come to (held and sold), writing nothing."""
        await self._redis.sadd(items_registry(self._prefix), item.item_id)  # as load_item does
        keys = self.keys(item.item_id, shard)
        reply = await self._call(
            ScriptName.RECOVER,
            item.item_id,
            item.total if total is None else total,
            item.starts_at_ms,
            item.ends_at_ms,
            item.per_buyer_limit,
            item.hold_ms,
            self.now_arg(),
            last_landed_id,
            json.dumps([list(order) for order in orders]),
            json.dumps([list(payment) for payment in payments]),
            item.stock_shards,
            item.total,
            "plan" if plan else "",
            extra_keys=(keys.payments, keys.transfers, keys.in_transit),
            shard=shard,
        )
        restored, advanced, conflicts, available, held, sold = (int(n) for n in reply[1:7])
        return Recovery(
            restored, advanced, conflicts, Stock(available + held + sold, available, held, sold)
        )

    async def restore_events(
        self, item_id: int, shard: int, entries: Sequence[tuple[str, dict[str, str]]]
    ) -> tuple[int, int]:
        """Put back on a shard's stream, under their own ids, events it lost that SQL landed
        (``entries`` in id order; restore_events.lua): how many went back, how many the
        stream already had (or had and trimmed)."""
        restored = skipped = 0
        for start in range(0, len(entries), RESTORE_BATCH):
            batch = [[entry_id, [x for pair in fields.items() for x in pair]]
                     for entry_id, fields in entries[start : start + RESTORE_BATCH]]  # fmt: skip
            reply = await self._call(
                ScriptName.RESTORE_EVENTS, item_id, json.dumps(batch), shard=shard
            )
            restored, skipped = restored + int(reply[0]), skipped + int(reply[1])
        return restored, skipped

    # redis-py types its replies loosely (bytes | str, sync | async); the client here always
    # decodes, so the reads below state the shapes they get.

    async def item(self, item_id: int) -> SaleItem | None:
        """The item's sale settings as loaded (from its head), or None."""
        # Through the pipeliner: every ticket asks (the ticket office's window check).
        raw = cast(
            list[str | None],
            await self.execute(
                "HMGET", self.keys(item_id).item, *_ITEM_FIELDS, "shards", "item_total"
            ),
        )
        if any(v is None for v in raw[: len(_ITEM_FIELDS)]):
            return None
        settings = dict(zip(_ITEM_FIELDS, (int(v or 0) for v in raw), strict=False))
        shards = int(raw[-2] or 1)
        if shards > 1:
            settings["total"] = int(raw[-1] or 0)  # the head's own total is its shard's
        return SaleItem(item_id=item_id, stock_shards=shards, **settings)

    async def terms(self, item_id: int) -> tuple[SaleItem | None, bool]:
        """The item's settings as loaded (None: not loaded), and whether its head is fenced (it
        sells nothing until verified): one script, through the pipeliner (every ticket asks)."""
        raw = cast(
            list[Any], await self._scripts.call(ScriptName.TERMS, self.keys(item_id).all_fixed(),
                                                (item_id,))
        )  # fmt: skip
        fenced = raw[-1] == 1
        if any(v is None for v in raw[:5]):
            return None, fenced
        settings = dict(zip(_ITEM_FIELDS, (int(v) for v in raw[:5]), strict=True))
        shards = int(raw[5] or 1)
        if shards > 1:
            settings["total"] = int(raw[6] or 0)  # the head's own total is its shard's
        return SaleItem(item_id=item_id, stock_shards=shards, **settings), fenced

    async def stock(self, item_id: int) -> Stock | None:
        """The item's counters, or None. Unsharded: read in one command (so they are
        consistent). With shards: each shard read at once with its transfers, put on one cut
        by :func:`combined_stock`, so ``available + held + sold == total`` as on one shard."""
        shards = await self._shard_counts.of(item_id)
        if shards == 1:
            values = await self._hmget(self.keys(item_id).item, STOCK_FIELDS)
            return None if values is None else Stock(*values)
        parts = await asyncio.gather(*(self.shard_stock(item_id, s) for s in range(shards)))
        if any(part is None for part in parts):
            return None
        item_total = await self._hmget(self.keys(item_id).item, ("item_total",))
        assert item_total is not None
        return combined_stock(item_total[0], [p for p in parts if p is not None])

    async def available(self, item_id: int) -> int | None:
        """Units left, for a buyer's eyes: one read per shard, no transfer records, so units in
        transit between two shards (for one round trip) are not counted. None: not loaded."""
        counts = await asyncio.gather(
            *(
                self.execute("HGET", keys.item, "available")
                for keys in await self.shard_keys(item_id)
            )
        )
        if any(count is None for count in counts):
            return None
        return sum(int(count) for count in counts)

    async def shard_stock(self, item_id: int, shard: int) -> tuple[Stock, Transfers] | None:
        """One shard's counters and transfer records, read at once; None if it is not loaded."""
        keys = self.keys(item_id, shard)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.hmget(keys.item, list(STOCK_FIELDS))
            tx.hgetall(keys.transfers)
            counters, transfers = await tx.execute()
        if any(v is None for v in counters):
            return None
        return Stock(*(int(v) for v in counters)), _transfers(transfers)

    async def hold(self, item_id: int, order_id: int) -> Hold | None:
        holds = self.keys(item_id, await self.order_shard(item_id, order_id)).holds
        raw = cast(str | None, await self._redis.hget(holds, str(order_id)))
        return None if raw is None else _hold(order_id, raw)

    async def holds(self, item_id: int) -> dict[int, Hold]:
        """Every hold of an item, in any state, from every shard (for audits and tests;
        O(holds))."""
        out: dict[int, Hold] = {}
        for keys in await self.shard_keys(item_id):
            raw = cast(dict[str, str], await self._redis.hgetall(keys.holds))
            out.update({int(k): _hold(int(k), v) for k, v in raw.items()})
        return out

    async def events(self, item_id: int, shard: int = 0) -> list[tuple[str, dict[str, str]]]:
        """A shard's whole journal (shard 0: an unsharded item's), oldest first (for audits and
        tests; O(events))."""
        key, start = self.keys(item_id, shard).events, "-"
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
        """Held order ids and their deadlines (ms), from every shard's expiry index."""
        out: dict[int, int] = {}
        for keys in await self.shard_keys(item_id):
            raw = cast(
                list[tuple[str, float]],
                await self._redis.zrange(keys.deadlines, 0, -1, withscores=True),
            )
            out.update({int(order_id): int(score) for order_id, score in raw})
        return out

    async def buyer_units(self, item_id: int) -> dict[str, int]:
        """Units held or paid per buyer (buyers at zero are not listed), from every shard."""
        out: dict[str, int] = {}
        for keys in await self.shard_keys(item_id):
            raw = cast(dict[str, str], await self._redis.hgetall(keys.buyers))
            for buyer, units in raw.items():
                out[buyer] = out.get(buyer, 0) + int(units)
        return out

    async def snapshot(self, item_id: int, shard: int = 0) -> ItemSnapshot:
        """One shard's whole state (shard 0: an unsharded item's) in one MULTI/EXEC. With
        shards, ``item`` is the item's settings and ``stock`` the shard's own counters."""
        [snapshot] = await self.snapshots([(item_id, shard)])
        return snapshot

    async def snapshots(self, shards: Sequence[tuple[int, int]]) -> list[ItemSnapshot]:
        """Snapshots of many (item, shard), in order, each as ``snapshot`` reads it: one script
        each (snapshot.lua, alone while it runs), sent together (through the pipeliner, one
        round trip per node)."""
        counts = [await self._shard_counts.of(item_id) for item_id, _ in shards]
        every = [self.keys(item_id, shard) for item_id, shard in shards]
        replies = await asyncio.gather(
            *(
                self._scripts.call(
                    ScriptName.SNAPSHOT,
                    (*keys.all_fixed(), keys.transfers, keys.payments),
                    (keys.item_id,),
                )
                for keys in every
            )
        )
        return [
            _snapshot(keys, count, reply)
            for keys, count, reply in zip(every, counts, replies, strict=True)
        ]

    async def last_event_ids(self, shards: Sequence[tuple[int, int]]) -> list[str]:
        """The last id each (item, shard)'s stream generated ("0-0": no stream), in order, in
        one pipeline."""
        if not shards:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for item_id, shard in shards:
                pipe.xinfo_stream(self.keys(item_id, shard).events)
            replies = await pipe.execute(raise_on_error=False)
        ids = []
        for reply in replies:
            if isinstance(reply, ResponseError):  # no such key
                ids.append("0-0")
            elif isinstance(reply, Exception):
                raise reply
            else:
                ids.append(str(reply["last-generated-id"]))
        return ids

    async def shard_remains(self, item_id: int, shard: int = 0) -> ShardRemains:
        """What archiving a shard must move to SQL first, read in one MULTI/EXEC."""
        keys = self.keys(item_id, shard)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.xinfo_stream(keys.events)
            tx.hgetall(keys.payments)
            tx.xrange(keys.dead_letters)
            stream, payments, dead = await tx.execute(raise_on_error=False)
        if isinstance(stream, ResponseError):  # no such key: the stream was never written
            stream = {"last-generated-id": "0-0"}
        for reply in (payments, dead):
            if isinstance(reply, Exception):
                raise reply
        return ShardRemains(
            last_event_id=str(stream["last-generated-id"]),
            payments={k: json.loads(v) for k, v in cast(dict[str, str], payments).items()},
            dead_letters=cast(list[tuple[str, dict[str, str]]], dead),
        )

    async def archive_shard(
        self, item_id: int, shard: int, remains: ShardRemains
    ) -> Unsettled | None:
        """Delete every key of a settled shard at once, if nothing changed since ``remains`` was
        read; None when done (or already gone), else why not (nothing deleted)."""
        keys = self.keys(item_id, shard)
        rest: tuple[str, ...] = (keys.transfers, keys.in_transit)
        if shard == 0:  # the waiting room (but the head, which is the item's) and the card
            queue = queue_keys(item_id, self._prefix).all()[1:]
            rest += (*queue, *item_card_keys(item_id, self._prefix))
        reply = await self._call(
            ScriptName.ARCHIVE,
            item_id,
            self.now_arg(),
            remains.last_event_id,
            len(remains.payments),
            len(remains.dead_letters),
            extra_keys=(keys.dead_letters, keys.payments, *rest),
            shard=shard,
        )
        return None if Outcome(reply[0]) is Outcome.ARCHIVED else Unsettled(reply[1])

    async def forget_item(self, item_id: int, shards: int) -> int:
        """After its ``shards`` are archived: the item leaves the registries, and its buyers'
        idempotency records and rate windows (which would expire anyway) go now; returns how
        many of those were deleted. A SCAN: once per archived item, never on a sale's path."""
        await self._redis.srem(items_registry(self._prefix), item_id)
        await self._redis.srem(queues_registry(self._prefix), item_id)
        deleted = 0
        for shard in range(shards):
            keys = self.keys(item_id, shard)
            for prefix in (keys.idempotency_prefix, keys.rate_prefix):
                batch = [key async for key in self._redis.scan_iter(match=prefix + "*", count=1000)]
                for at in range(0, len(batch), 500):
                    deleted += int(await self._redis.delete(*batch[at : at + 500]))
        self._shard_counts.forget(item_id)
        return deleted

    async def _hmget(self, key: str, fields: tuple[str, ...]) -> list[int] | None:
        values = cast(list[str | None], await self._redis.hmget(key, list(fields)))
        if any(v is None for v in values):
            return None
        return [int(v) for v in values if v is not None]


def _snapshot(keys: ItemKeys, shards: int, reply: list[Any]) -> ItemSnapshot:
    """An ItemSnapshot from snapshot.lua's reply."""
    now_ms, item_flat, holds, buyers, deadlines, events, last_id, transfers, payments, live = reply
    item = _pairs(item_flat)
    complete = all(f in item for f in _ITEM_FIELDS)
    settings = {f: int(item[f]) for f in _ITEM_FIELDS} if complete else {}
    if complete and shards > 1:
        settings["total"] = int(item["item_total"])
    item_id = keys.item_id
    return ItemSnapshot(
        item_id=item_id,
        item=SaleItem(item_id=item_id, stock_shards=shards, **settings) if complete else None,
        stock=Stock(*(int(item[f]) for f in STOCK_FIELDS)) if complete else None,
        holds={int(k): _hold(int(k), v) for k, v in _pairs(holds).items()},
        buyers={b: int(n) for b, n in _pairs(buyers).items()},
        deadlines={int(o): int(score) for o, score in _pairs(deadlines).items()},
        events=[(entry_id, _pairs(fields)) for entry_id, fields in events],
        last_event_id=str(last_id),
        now_ms=int(now_ms),
        shard=keys.shard,
        shards=shards,
        transfers=_transfers(_pairs(transfers)),
        payments={p: json.loads(record) for p, record in _pairs(payments).items()},
        run=item.get("run", ""),
        fenced=complete and item.get("run") != live,
    )


def _pairs(flat: list[str]) -> dict[str, str]:
    """A flat (field, value, ...) reply as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _transfers(raw: dict[str, str]) -> Transfers:
    return {name: json.loads(record) for name, record in raw.items()}


def _reason(reply: list[Any], at: int) -> ReleaseReason | None:
    return ReleaseReason(reply[at]) if len(reply) > at else None


def _reserve_options(rate_args: tuple[str, str] | None, request_id: str) -> tuple[str, str, str]:
    """reserve.lua's ARGV 7-9 (rate limit, request id; "" for none)."""
    return (*(rate_args or ("", "")), request_id)


# Outcome(code) through the enum's own lookup costs a microsecond a purchase; a dict does not.
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}


def _reservation(reply: list[Any]) -> Reservation:
    code = _OUTCOMES[reply[0]]
    if len(reply) == 1:
        return Reservation(code)
    if code is Outcome.RATE_LIMITED:
        return Reservation(code, retry_after_ms=int(reply[1]))
    replayed = code is not Outcome.RESERVED
    outcome = Outcome.RESERVED if code is Outcome.REPLAY else code
    return Reservation(outcome, int(reply[1]), int(reply[2]), replayed=replayed)


def _transition(reply: list[Any]) -> HoldTransition:
    return HoldTransition(Outcome(reply[0]), _reason(reply, 1))


def _settlement(reply: list[Any], *, replayed: bool = False) -> PaymentSettlement:
    """A settlement from {outcome, reason if any}: a refund's reason says why the charge goes
    back, any other says why the hold was released."""
    outcome = Outcome(reply[0])
    reasons = RefundReason if outcome is Outcome.REFUND_REQUIRED else ReleaseReason
    reason = reasons(reply[1]) if len(reply) > 1 else None
    return PaymentSettlement(outcome, reason, replayed=replayed)


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
        payment_id=record.get("payment_id"),
    )
