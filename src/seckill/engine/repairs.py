"""The engine's repairs: the fence, the reconciler's replays and recounts, recovery from SQL,
and archiving. Operator and worker actions, O(holds); never on the purchase path.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from redis.asyncio.cluster import RedisCluster

from seckill.domain import rules
from seckill.domain.items import SaleItem, Stock
from seckill.domain.lifecycle import Unsettled
from seckill.domain.outcomes import Outcome
from seckill.engine.base import EngineBase, queue_args
from seckill.engine.keys import (
    fenced_registry,
    item_card_keys,
    items_registry,
    queue_keys,
    queues_registry,
)
from seckill.engine.reads import ShardRemains
from seckill.engine.scripts import ScriptName


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
_TAKE_AT_MOST = 1_000_000  # flagged items taken at once: every one there is
RESTORE_BATCH = 500  # events put back per script call: each call blocks its node meanwhile


class EngineRepairs(EngineBase):
    """Fencing, repairs, recovery and archiving of an item's Redis state (part of
    ``RedisEngine``)."""

    # -- the fence (see live_run in _common.lua) ---------------------------------------------

    async def fence(self, item_id: int, shard: int, why: str) -> Outcome:
        """Fence a stock shard found behind SQL: it sells nothing until verified again. The item
        is flagged for the fence check too, wherever that runs (``fence_look``)."""
        reply = await self._call(ScriptName.FENCE, item_id, "fence", "", why, shard=shard)
        await self.flag_fenced([item_id])
        return Outcome(reply[0])

    async def flag_fenced(self, item_ids: Sequence[int]) -> None:
        """Have the fence check look at these items (fenced, or left fenced) at its next pass."""
        if item_ids:
            await self._redis.sadd(fenced_registry(self.prefix), *item_ids)

    async def fence_look(self) -> tuple[list[int], frozenset[tuple[object, ...]] | None]:
        """What the fence check starts from: the items flagged since its last look, taken off
        the registry at once (a detector flags after it fences, so one flagged after this is
        looked at next time), and what a shard's fence follows from as the servers say now
        (``servers_seen``). On one Redis, one round trip."""
        registry = fenced_registry(self.prefix)
        servers: frozenset[tuple[object, ...]] | None
        if isinstance(self._redis, RedisCluster):
            flagged = await self._redis.spop(registry, _TAKE_AT_MOST)
            servers = await self.servers_seen()
        else:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.spop(registry, _TAKE_AT_MOST)
                pipe.info("server")
                flagged, info = await pipe.execute()
            servers = frozenset({(str(info["run_id"]),)})
        return sorted(int(member) for member in cast(list[str], flagged or [])), servers

    async def servers_seen(self) -> frozenset[tuple[object, ...]] | None:
        """What a shard's fence follows from, as the servers say now: each server's run id and,
        on a cluster, the slots each serves. Unchanged since every shard was checked, no shard
        can have been fenced since but by a detector (``fence``: flagged). None: a serving node
        this client cannot reach yet (the caller checks every item)."""
        if not isinstance(self._redis, RedisCluster):
            info = await self._redis.info("server")
            return frozenset({(str(info["run_id"]),)})
        # redis-py parses CLUSTER SLOTS into {(start, end): {"primary": (host, port), ...}}.
        served = cast(dict[tuple[int, int], dict[str, Any]], await self._redis.cluster_slots())
        runs: dict[tuple[str, int], str] = {}
        for host, port in {tuple(slots["primary"]) for slots in served.values()}:
            node = self._redis.get_node(host=host, port=port)
            if node is None:
                return None
            info = await self._redis.info("server", target_nodes=node)
            runs[host, port] = str(info["run_id"])
        return frozenset(
            (start, end, runs[tuple(slots["primary"])]) for (start, end), slots in served.items()
        )

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
        return sorted({i for (i, _), reply in zip(shards, replies, strict=True) if reply[7] == 1})

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
            *queue_args(item),
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
