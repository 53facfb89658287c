"""The Redis engine: plain async functions that decide and move stock, one script call each.

No framework types here, so any route, worker or benchmark can call it directly. This module
holds the write path (loading an item, reserving, moving stock between shards, releasing,
settling payments, expiring holds); ``RedisEngine`` adds to it the reads (``engine/reads.py``)
and the repairs (``engine/repairs.py``), all on one base (``engine/base.py``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from seckill.domain import rules
from seckill.domain.events import RefundReason, ReleaseReason
from seckill.domain.holds import HoldTransition, PaymentSettlement, Reservation
from seckill.domain.items import SaleItem
from seckill.domain.money import Money
from seckill.domain.outcomes import Outcome
from seckill.domain.shards import home_shard, split_stock
from seckill.engine.base import queue_args
from seckill.engine.cluster import time_ms
from seckill.engine.keys import items_registry
from seckill.engine.reads import EngineReads
from seckill.engine.repairs import EngineRepairs
from seckill.engine.scripts import ScriptName

_SHORT = frozenset({Outcome.SOLD_OUT, Outcome.INSUFFICIENT_STOCK})

# A purchase whose home shard is short takes the units it needs from the fullest other shards,
# then asks its home again. Another buyer of the same home may take them first (and bought
# them): then it goes again, until a round finds no other shard with any, or after this many
# rounds (a bound against livelock; each lost round was a unit sold to someone else).
TRANSFER_ROUNDS = 16
# A transfer still in transit this long after it was sent is delivered by the reaper: its sender
# stopped between the two halves (usually it delivers within the same request).
TRANSIT_GRACE_MS = 1_000


class RedisEngine(EngineReads, EngineRepairs):
    """Sells items held in one Redis (or one cluster slot per item).

    ``clock`` exists for tests and simulations that need to move time; in production leave it
    unset so every decision uses the one clock all processes share: Redis's own.
    ``rate_limit``: purchase attempts per buyer and item (None: unlimited); the rate windows
    follow the same clock.
    With a pipeliner in ``scripts``, the one read on the purchase path (``recorded``) is batched
    with the scripts' calls.
    """

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
            *queue_args(item),
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
        times: ``sold_out`` then means every other shard answered that it had nothing left. A
        fenced shard cannot answer: if one was asked and nothing moved, ``item_recovering``.
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
            moved, recovering = await self._take_stock(
                item_id, to=home, need=quantity, transfer_id=f"{order_id}.{transfer}",
                shards=shards,
            )  # fmt: skip
            if not moved:
                if recovering:  # a shard that may hold units is fenced: not sold out, not yet
                    return Reservation(Outcome.ITEM_RECOVERING)
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
    ) -> tuple[int, bool]:
        """Move ``need`` units to shard ``to`` from the other shards, fullest first, as far as
        they have any; returns the units moved (0: each had none when asked, or could not say)
        and whether a shard that could not say was asked (fenced: being recovered)."""
        others = [shard for shard in range(shards) if shard != to]
        available = await asyncio.gather(
            *(self.execute("HGET", self.keys(item_id, s).item, "available") for s in others)
        )
        donors = sorted(
            ((int(a), s) for a, s in zip(available, others, strict=True) if a and int(a) > 0),
            reverse=True,
        )
        moved, recovering = 0, False
        for _, donor in donors:
            units = await self._transfer(
                item_id, source=donor, to=to, need=need - moved,
                transfer_id=f"{transfer_id}.{donor}",
            )  # fmt: skip
            if units is None:
                recovering = True
                continue
            moved += units
            if moved >= need:
                break
        return moved, recovering

    async def transfer(
        self, item_id: int, *, source: int, to: int, need: int, transfer_id: str
    ) -> int:
        """Move stock from shard ``source`` to shard ``to``: ``need`` units, or all the source
        has if that is less (see transfer_out.lua); returns the units moved. Idempotent
        per ``transfer_id``. If the second half fails, the units stay in transit until
        :meth:`deliver_in_transit` (the reaper) delivers them."""
        units = await self._transfer(
            item_id, source=source, to=to, need=need, transfer_id=transfer_id
        )
        return units or 0

    async def _transfer(
        self, item_id: int, *, source: int, to: int, need: int, transfer_id: str
    ) -> int | None:
        """``transfer``'s work; None when the source shard is fenced (it cannot say what it
        has until it is recovered)."""
        sent = self.keys(item_id, source)
        reply = await self._call(
            ScriptName.TRANSFER_OUT, item_id, transfer_id, to, need, self.now_arg(),
            extra_keys=(sent.transfers, sent.in_transit), shard=source,
        )  # fmt: skip
        outcome = Outcome(reply[0])
        if outcome is Outcome.ITEM_RECOVERING:
            return None
        if outcome not in (Outcome.TRANSFERRED, Outcome.REPLAY):
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
        self,
        item_id: int,
        order_id: int,
        *,
        payment_id: str,
        succeeded: bool,
        charged: Money,
        unit_price: Money,
        landed: bool | None = False,
    ) -> PaymentSettlement:
        """Apply a payment provider's notice once per ``payment_id``, which names one payment of
        the item: ``charged`` (what the provider took) for the order, whose sum is ``unit_price``
        (the item's, from SQL) times its quantity (see settle_payment.lua).

        Succeeded: held -> paid when ``charged`` is the order's sum. Any other sum or currency,
        a success for an order already released or paid by another payment, or for an order no
        shard holds, answers ``refund_required`` and journals a refund owed of the sum charged;
        but not for one SQL holds (``landed``): Redis lost it, recovery gives it back, and the
        notice answers ``unknown_order`` meanwhile, recording nothing; ``landed`` None (SQL not
        asked yet) answers so too, for the caller to ask SQL only then and call again.
        Failed: held -> released (``payment_failed``); a paid hold stays paid
        (``already_paid``); an unknown order answers ``unknown_order`` and is not recorded. A
        payment id seen before answers what it answered then (``replayed``), or refuses with
        ``payment_id_reused`` if it now names another order, result or charge, whatever the
        shards.
        """
        rules.check_item_id(item_id)
        rules.check_order_id(order_id)
        rules.check_payment_id(payment_id)
        rules.check_payment_result(succeeded)
        rules.check_amount(charged.cents)
        rules.check_currency(charged.currency)
        notice = (
            order_id, payment_id, "succeeded" if succeeded else "failed", charged.cents,
            charged.currency,
        )  # fmt: skip
        shard = await self.order_shard(item_id, order_id)
        if shard:  # the item's head keeps every payment id it has seen: claimed there first
            claim = await self._call(
                ScriptName.CLAIM_PAYMENT, item_id, *notice, shard,
                extra_keys=(self.keys(item_id).payments,),
            )  # fmt: skip
            if claim[0] == Outcome.ITEM_RECOVERING:
                return PaymentSettlement(Outcome.ITEM_RECOVERING)
            shard = int(claim[1])
        terms = (
            unit_price.cents, unit_price.currency, {None: "", True: "1", False: "0"}[landed]
        )  # fmt: skip
        reply = await self._settle(item_id, shard, notice, terms)
        if reply[0] == Outcome.CLAIMED:  # the order left its shard (archived) since the claim
            reply = await self._settle(item_id, int(reply[1]), notice, terms)
        if reply[0] == Outcome.REPLAY:
            return _settlement(reply[1:], replayed=True)
        return _settlement(reply)

    async def _settle(
        self, item_id: int, shard: int, notice: tuple[Any, ...], terms: tuple[Any, ...]
    ) -> Any:
        return await self._call(
            ScriptName.SETTLE_PAYMENT, item_id, *notice, self.now_arg(), *terms,
            extra_keys=(self.keys(item_id, shard).payments,), shard=shard,
        )  # fmt: skip

    async def expire_due(self, item_id: int, *, limit: int = 500, shard: int = 0) -> list[int]:
        """Release at most ``limit`` holds of one shard past their deadline; returns their order
        ids."""
        rules.check_item_id(item_id)
        rules.check_batch(limit)
        reply = await self._call(ScriptName.EXPIRE_DUE, item_id, self.now_arg(), limit, shard=shard)
        return [int(order_id) for order_id in reply]


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
