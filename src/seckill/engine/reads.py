"""The engine's reads: an item's settings and counters for buyers' eyes, its holds, journal and
whole state (snapshots) for the audit, the reconciler and the dashboard. Nothing here writes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.exceptions import ResponseError

from seckill.domain.events import ReleaseReason
from seckill.domain.holds import Hold, HoldState
from seckill.domain.items import STOCK_FIELDS, SaleItem, Stock
from seckill.engine.base import EngineBase
from seckill.engine.keys import ItemKeys
from seckill.engine.scripts import ScriptName

Transfers = dict[str, dict[str, int]]
"""A shard's transfer records: "out:<id>" / "in:<id>" -> {units, the other shard, at_ms}."""


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
    # The transfers this shard sent and has not seen delivered (its in-transit index).
    in_transit: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRemains:
    """What archiving a shard moves to SQL first, as one read: the payment notices it recorded
    (payment id -> the answer, JSON decoded) and its dead letters (each a sink gave up on),
    as of its stream's ``last_event_id``."""

    last_event_id: str
    payments: dict[str, dict[str, Any]]
    dead_letters: list[tuple[str, dict[str, str]]]


_ITEM_FIELDS = ("total", "starts_at_ms", "ends_at_ms", "per_buyer_limit", "hold_ms")


def _sale_item(
    item_id: int,
    shards: int,
    settings: dict[str, int],
    *,
    waiting_room: bool = False,
    queue_admit_per_second: int | None = None,
    queue_open_ms: int | None = None,
) -> SaleItem:
    """A SaleItem from its head's fields (``_ITEM_FIELDS``, as integers)."""
    return SaleItem(
        item_id=item_id,
        total=settings["total"],
        starts_at_ms=settings["starts_at_ms"],
        ends_at_ms=settings["ends_at_ms"],
        per_buyer_limit=settings["per_buyer_limit"],
        hold_ms=settings["hold_ms"],
        stock_shards=shards,
        waiting_room=waiting_room,
        queue_admit_per_second=queue_admit_per_second,
        queue_open_seconds=None if queue_open_ms is None else queue_open_ms // 1000,
    )


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)


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


class EngineReads(EngineBase):
    """Reads of an item's Redis state (part of ``RedisEngine``)."""

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
        return _sale_item(item_id, shards, settings)

    async def terms(self, item_id: int) -> tuple[SaleItem | None, bool]:
        """The item's settings as loaded (None: not loaded; its waiting room told, not its
        pace), and whether its head is fenced (it sells nothing until verified): one script,
        through the pipeliner (every ticket asks)."""
        raw = cast(
            list[Any], await self._scripts.call(ScriptName.TERMS, self.keys(item_id).all_fixed(),
                                                (item_id,))
        )  # fmt: skip
        fenced = raw[7] == 1
        if any(v is None for v in raw[:5]):
            return None, fenced
        settings = dict(zip(_ITEM_FIELDS, (int(v) for v in raw[:5]), strict=True))
        shards = int(raw[5] or 1)
        if shards > 1:
            settings["total"] = int(raw[6] or 0)  # the head's own total is its shard's
        room = len(raw) > 8 and raw[8] == "1"
        return _sale_item(item_id, shards, settings, waiting_room=room), fenced

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
                    (*keys.all_fixed(), keys.transfers, keys.payments, keys.in_transit),
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


def _snapshot(keys: ItemKeys, shards: int, reply: list[Any]) -> ItemSnapshot:
    """An ItemSnapshot from snapshot.lua's reply."""
    now_ms, item_flat, holds, buyers, deadlines, events, last_id, transfers, payments = reply[:9]
    live, in_transit = reply[9:]
    item = _pairs(item_flat)
    complete = all(f in item for f in _ITEM_FIELDS)
    settings = {f: int(item[f]) for f in _ITEM_FIELDS} if complete else {}
    if complete and shards > 1:
        settings["total"] = int(item["item_total"])
    item_id = keys.item_id
    return ItemSnapshot(
        item_id=item_id,
        item=_sale_item(
            item_id,
            shards,
            settings,
            waiting_room=item.get("waiting_room") == "1",
            queue_admit_per_second=_optional_int(item.get("queue_admit_per_second")),
            queue_open_ms=_optional_int(item.get("queue_open_ms")),
        )
        if complete
        else None,
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
        in_transit=frozenset(in_transit),
    )


def _pairs(flat: list[str]) -> dict[str, str]:
    """A flat (field, value, ...) reply as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _transfers(raw: dict[str, str]) -> Transfers:
    return {name: json.loads(record) for name, record in raw.items()}


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
