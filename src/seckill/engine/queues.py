"""Items' waiting rooms in Redis: joining, finding one's place, the inlet's step, and the reading
every buyer's standing is worked out from.

Each queue lives in its item's slot (engine.keys.QueueKeys) and changes only through three
scripts: queue_join, queue_place (whose one write is the seal at the start) and queue_advance.
The registry of queues (``queues_registry``) names the items someone joined, so the inlet walks
those and not every item ever sold.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from seckill.domain.outcomes import Outcome
from seckill.domain.queue import QueueFront
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import QueueKeys, queue_keys, queues_registry
from seckill.engine.scripts import ScriptName

# A draw is a random integer below 10**15: a Lua number (a double) holds it exactly, and the
# scripts' integer arguments have at most 15 digits.
DRAW_BELOW = 10**15
# The inlet's pace is measured over this long.
PACE_WINDOW_MS = 10_000


@dataclass(frozen=True, slots=True)
class Joined:
    outcome: Outcome  # QUEUED, ALREADY_QUEUED, NOT_STARTED, ENDED, NOT_QUEUED (no room) or
    # UNKNOWN_ITEM
    position: int = 0  # 0: drawn at the start
    opens_at_ms: int | None = None  # NOT_STARTED: when the queue opens


@dataclass(frozen=True, slots=True)
class Place:
    outcome: Outcome  # PLACED, NOT_QUEUED or UNKNOWN_ITEM
    position: int = 0  # 0: not drawn yet (or not queued)
    admitted_up_to: int = 0
    joined_at_ms: int = 0  # when the wait began: the start, for a pre-start joiner


@dataclass(frozen=True, slots=True)
class Advance:
    outcome: Outcome  # ADVANCED, NOT_STARTED, ENDED or UNKNOWN_ITEM
    admitted_up_to: int = 0
    length: int = 0
    moved: int = 0  # positions this step let in


@dataclass(frozen=True, slots=True)
class Admission:
    """One step of the inlet: every position up to ``upto`` let in at ``at_ms`` (Redis time)."""

    at_ms: int
    upto: int


@dataclass(frozen=True, slots=True)
class QueueCounts:
    joined: int  # buyers in the queue, drawn or not
    admitted_up_to: int


def secret_draw() -> int:
    """An unpredictable draw: nobody can tell a pre-start joiner's place before the start."""
    return secrets.randbelow(DRAW_BELOW)


class Queues:
    """The waiting rooms of one engine's items. ``draw`` gives each pre-start joiner's random
    key (tests pass a seeded one)."""

    def __init__(self, engine: RedisEngine, *, draw: Callable[[], int] = secret_draw) -> None:
        self._engine = engine
        self._draw = draw
        self._registry = queues_registry(engine.prefix)

    def keys(self, item_id: int) -> QueueKeys:
        return queue_keys(item_id, self._engine.prefix)

    async def join(self, item_id: int, buyer: str, *, lead_ms: int) -> Joined:
        """Put ``buyer`` in the item's queue (or find them there). The queue opens ``lead_ms``
        before the sale starts, or as long before as the item says; ``NOT_QUEUED`` for an item
        without a waiting room; an InvalidRequest for a malformed buyer id."""
        reply = await self._call(ScriptName.QUEUE_JOIN, item_id, buyer, self._draw(), lead_ms)
        outcome = Outcome(reply[0])
        if outcome in (Outcome.QUEUED, Outcome.ALREADY_QUEUED):
            if outcome is Outcome.QUEUED:
                # After the join (the registry lives in another slot): an inlet that misses the
                # item for a moment only delays its first step.
                await self._engine.execute("SADD", self._registry, str(item_id))
            return Joined(outcome, int(reply[1]))
        if outcome is Outcome.NOT_STARTED:
            return Joined(outcome, opens_at_ms=int(reply[1]))
        return Joined(outcome)

    async def place(self, item_id: int, buyer: str) -> Place:
        reply = await self._call(ScriptName.QUEUE_PLACE, item_id, buyer)
        outcome = Outcome(reply[0])
        if outcome is Outcome.PLACED:
            return Place(outcome, int(reply[1]), int(reply[2]), int(reply[3]))
        if outcome is Outcome.NOT_QUEUED:
            return Place(outcome, admitted_up_to=int(reply[1]))
        return Place(outcome)

    async def advance(self, item_id: int, *, rate: int, per_unit: int, turn_ms: int) -> Advance:
        """One inlet step (see queue_advance.lua); the units available are read first, so the
        stock cap may lag a purchase by one step: it is a pace, not a guarantee."""
        available = 0
        if per_unit:
            available = await self._engine.available(item_id) or 0
        reply = await self._call(
            ScriptName.QUEUE_ADVANCE, item_id, rate, per_unit, available, turn_ms
        )
        outcome = Outcome(reply[0])
        if outcome is Outcome.ADVANCED:
            return Advance(outcome, *(int(n) for n in reply[1:4]))
        return Advance(outcome)

    async def front(self, item_id: int) -> QueueFront | None:
        """The queue and stock as they stand (a few reads, batched), or None for an item not
        loaded. Reads only: a queue nobody has joined reads as empty."""
        keys = self.keys(item_id)
        engine = self._engine
        shards = await engine.shard_keys(item_id)
        window, queue, latest, counts = await asyncio.gather(
            engine.execute("HMGET", keys.item, "starts_at_ms", "ends_at_ms"),
            engine.execute("HMGET", keys.queue, "sealed", "late", "admitted"),
            engine.execute("XREVRANGE", keys.admissions, "+", "-", "COUNT", "1"),
            asyncio.gather(*(engine.execute("HMGET", s.item, "available", "held") for s in shards)),
        )
        if window[0] is None or any(c[0] is None for c in counts):
            return None
        sealed, late, admitted = queue
        return QueueFront(
            starts_at_ms=int(window[0]),
            ends_at_ms=int(window[1]),
            sealed=sealed is not None,
            length=int(sealed or 0) + int(late or 0),
            admitted_up_to=int(admitted or 0),
            available=sum(int(c[0]) for c in counts),
            held=sum(int(c[1]) for c in counts),
            admissions_per_s=await self._pace(keys, latest),
        )

    async def _pace(self, keys: QueueKeys, latest: list[Any]) -> float | None:
        """Positions let in per second over the ``PACE_WINDOW_MS`` up to the inlet's latest
        step; None before its second step."""
        if not latest:
            return None
        last = _admission(latest[0])
        since = last.at_ms - PACE_WINDOW_MS
        earlier = await self._engine.execute("XREVRANGE", keys.admissions, since, "-", "COUNT", "1")
        if earlier:  # the frontier as it stood when the window opened
            first = Admission(since, _admission(earlier[0]).upto)
        else:  # the queue is younger than the window: from its first step
            first = _admission(
                (await self._engine.execute("XRANGE", keys.admissions, "-", "+", "COUNT", "1"))[0]
            )
        moved, elapsed_ms = last.upto - first.upto, last.at_ms - first.at_ms
        return moved * 1000 / elapsed_ms if moved > 0 and elapsed_ms > 0 else None

    async def counts(self, item_ids: Sequence[int]) -> list[QueueCounts | None]:
        """How many joined each item's queue and how far it moved (None: nobody joined), in
        one round trip per node (for the dashboard)."""
        async with self._engine.redis.pipeline(transaction=False) as pipe:
            for item_id in item_ids:
                keys = self.keys(item_id)
                pipe.hmget(keys.queue, ["late", "admitted"])
                pipe.zcard(keys.early)
            replies = await pipe.execute()
        found: list[QueueCounts | None] = []
        for (late, admitted), early in zip(replies[::2], replies[1::2], strict=True):
            joined = int(early) + int(late or 0)
            found.append(QueueCounts(joined, int(admitted or 0)) if joined else None)
        return found

    async def admissions(self, item_id: int) -> list[Admission]:
        """Every step of the inlet for this item, oldest first."""
        entries = await self._engine.execute("XRANGE", self.keys(item_id).admissions, "-", "+")
        return [_admission(entry) for entry in entries]

    async def queued_items(self) -> list[int]:
        """The items whose queue someone joined and that the inlet has not retired."""
        members = cast(set[str], await self._engine.redis.smembers(self._registry))
        return sorted(int(m) for m in members)

    async def retire(self, item_id: int) -> None:
        """Take an item off the inlet's rounds (its sale is over or it is gone); its queue's
        keys stay for the record."""
        await self._engine.redis.srem(self._registry, str(item_id))

    async def _call(self, name: ScriptName, item_id: int, *args: Any) -> list[Any]:
        reply = await self._engine.scripts.call(
            name, self.keys(item_id).all(), (*args, self._engine.now_arg())
        )
        return cast(list[Any], reply)


def _admission(entry: Any) -> Admission:
    # [id, [field, value]] as Redis sends it; redis-py's own client makes the fields a dict.
    entry_id, fields = entry
    upto = fields["upto"] if isinstance(fields, dict) else fields[1]
    return Admission(int(entry_id.partition("-")[0]), int(upto))
