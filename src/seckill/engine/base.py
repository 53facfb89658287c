"""What every part of the engine stands on: the client, the scripts, the keys, the clock, and
each item's shard count. The engine itself (``seckill.engine.engine.RedisEngine``) is this base
with its write path, its reads (``engine/reads.py``) and its repairs (``engine/repairs.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from seckill.domain import rules
from seckill.domain.items import SaleItem
from seckill.engine.cluster import RedisClient
from seckill.engine.keys import ItemKeys, item_keys, items_registry
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


class ShardCounts:
    """Each item's stock shard count, read from the item's head once per process: it never
    changes once the item is loaded (load_item refuses another)."""

    def __init__(self, redis: RedisClient, prefix: str) -> None:
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


async def registered_items(redis: RedisClient, prefix: str) -> list[int]:
    """Every item ever loaded, ascending: the one read of the items registry, for a worker that
    holds a connection rather than an engine (others ask ``RedisEngine.item_ids``)."""
    members = cast(set[str], await redis.smembers(items_registry(prefix)))
    return sorted(int(m) for m in members)


class EngineBase:
    """The engine's shared state and plumbing (see ``RedisEngine`` for the arguments)."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        scripts: Scripts,
        idempotency_ttl_ms: int,
        prefix: str,
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

    def shard_count_known(self, item_id: int) -> bool:
        """Whether the item's shard count was read (it is loaded): it will not change."""
        return self._shard_counts.known(item_id) is not None

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

    async def _hmget(self, key: str, fields: tuple[str, ...]) -> list[int] | None:
        values = cast(list[str | None], await self._redis.hmget(key, list(fields)))
        if any(v is None for v in values):
            return None
        return [int(v) for v in values if v is not None]


def queue_args(item: SaleItem) -> tuple[str, int | str, int | str]:
    """The item's waiting room as load_item and recover take it (see queue_args in
    _common.lua): "1" or "0", then its pace and its queue's lead in ms ("": the deployment's)."""
    lead = item.queue_open_seconds
    return (
        "1" if item.waiting_room else "0",
        "" if item.queue_admit_per_second is None else item.queue_admit_per_second,
        "" if lead is None else lead * 1000,
    )
