"""The Lua scripts: read once from the package, loaded into Redis once, called by EVALSHA.

Each item script is ``_common.lua`` (and ``_holds.lua`` if it moves or counts holds) followed by
its own file. A server that lost its script cache (a restart, a failover, SCRIPT FLUSH) answers
NOSCRIPT; the call then loads the script again and retries once, which is safe because a NOSCRIPT
reply means the script did not run.

With a ``Pipeliner``, plain calls are sent in batches with the other calls of the same event-loop
tick (see ``pipelining``): one round trip for many purchases. On a Redis Cluster, a
``ClusterPipeliner`` batches per node, and SCRIPT LOAD goes to every primary (redis-py's cluster
client sends it to all), also when a NOSCRIPT comes from a replica promoted since.

With a ``Durability``, each write script is sent together with ``WAIT`` in one round trip, and an
answer that reports a write is returned only once enough replicas have acknowledged it. These
calls do not go through the pipeliner yet; a later improvement could send one WAIT per batch.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.cluster import ClusterPipeliner, RedisClient, send_on_node
from seckill.engine.pipelining import Pipeliner
from seckill.observability import metrics

LUA_DIR = files("seckill.engine") / "lua"


class ScriptName(StrEnum):
    LOAD_ITEM = "load_item"
    RESERVE = "reserve"
    RELEASE = "release"
    SETTLE_PAYMENT = "settle_payment"
    CLAIM_PAYMENT = "claim_payment"
    EXPIRE_DUE = "expire_due"
    REPLAY_HOLDS = "replay_holds"
    REPLAY_REFUNDS = "replay_refunds"
    RECOUNT = "recount"
    RECOVER = "recover"
    TRANSFER_OUT = "transfer_out"
    TRANSFER_IN = "transfer_in"
    RENEW_LEASE = "renew_lease"
    DROP_LEASE = "drop_lease"
    QUEUE_JOIN = "queue_join"
    QUEUE_PLACE = "queue_place"
    QUEUE_ADVANCE = "queue_advance"
    ARCHIVE = "archive"
    SNAPSHOT = "snapshot"
    FENCE = "fence"
    TERMS = "terms"
    RESTORE_EVENTS = "restore_events"


# Scripts over one item's keys share the helpers and the KEYS layout of _common.lua.
ITEM_SCRIPTS = frozenset(
    {ScriptName.LOAD_ITEM, ScriptName.RESERVE, ScriptName.RELEASE, ScriptName.SETTLE_PAYMENT,
     ScriptName.CLAIM_PAYMENT, ScriptName.EXPIRE_DUE, ScriptName.REPLAY_HOLDS,
     ScriptName.REPLAY_REFUNDS, ScriptName.RECOUNT, ScriptName.RECOVER, ScriptName.TRANSFER_OUT,
     ScriptName.TRANSFER_IN, ScriptName.ARCHIVE, ScriptName.SNAPSHOT, ScriptName.FENCE,
     ScriptName.TERMS, ScriptName.RESTORE_EVENTS}
)  # fmt: skip

# Item scripts that move or count holds also take _holds.lua. The others go without: a script
# runs all the text it is sent on every call, and each helper defined costs a closure.
HOLD_SCRIPTS = frozenset(
    {ScriptName.RELEASE, ScriptName.SETTLE_PAYMENT, ScriptName.EXPIRE_DUE, ScriptName.RECOUNT,
     ScriptName.RECOVER}
)  # fmt: skip

# The scripts that take a payment notice share its argument rules and the payment id's record.
PAYMENT_SCRIPTS = frozenset({ScriptName.SETTLE_PAYMENT, ScriptName.CLAIM_PAYMENT})

# The waiting room's scripts take the keys of an item's queue (engine.keys.QueueKeys), the input
# helpers of _common.lua (not its item KEYS), and _queue.lua.
QUEUE_SCRIPTS = frozenset({ScriptName.QUEUE_JOIN, ScriptName.QUEUE_PLACE, ScriptName.QUEUE_ADVANCE})


# The writes whose answers reach buyers, admins and the payment provider: with a Durability they
# wait for replicas. The lease scripts (see leases) do not: a lost renewal is renewed again, a
# lost drop lapses; the repair scripts are an operator's, re-run until the reconciler finds no
# drift. A transfer's second half is sent only once its first is acknowledged: a lost first half
# with a received second would count the units twice. A queue position is a promise too; the
# inlet's step and the seal are not (lost, they are taken again from the state that survived).
# A payment id's claim keeps it to one order: lost, a second order could take it.
# An archived shard's removal is waited on so that SQL's record of it is not ahead for long.
WAITED_SCRIPTS = frozenset(
    {ScriptName.LOAD_ITEM, ScriptName.RESERVE, ScriptName.RELEASE, ScriptName.SETTLE_PAYMENT,
     ScriptName.CLAIM_PAYMENT, ScriptName.EXPIRE_DUE, ScriptName.TRANSFER_OUT,
     ScriptName.TRANSFER_IN, ScriptName.QUEUE_JOIN, ScriptName.ARCHIVE}
)  # fmt: skip


# Answers that refuse without promising anything: no one is told yes, so there is nothing to keep
# (a counted attempt's rate counter is their one write; losing it only gives an attempt back).
NOTHING_PROMISED = frozenset(
    {Outcome.SOLD_OUT, Outcome.INSUFFICIENT_STOCK, Outcome.LIMIT_REACHED, Outcome.NOT_STARTED,
     Outcome.ENDED, Outcome.UNKNOWN_ITEM, Outcome.RATE_LIMITED, Outcome.KEY_REUSED,
     Outcome.UNKNOWN_ORDER, Outcome.ITEM_RECOVERING}
)  # fmt: skip


def script_text(name: ScriptName) -> str:
    """One script as sent to Redis: an item script starts with the shared helpers it uses."""
    parts = [
        *(["_common"] if name in ITEM_SCRIPTS | QUEUE_SCRIPTS else []),
        *(["_holds"] if name in HOLD_SCRIPTS else []),
        *(["_payments"] if name in PAYMENT_SCRIPTS else []),
        *(["_queue"] if name in QUEUE_SCRIPTS else []),
        name.value,
    ]
    return "".join((LUA_DIR / f"{part}.lua").read_text(encoding="utf-8") for part in parts)


@dataclass(frozen=True, slots=True)
class Script:
    name: ScriptName
    source: str
    sha: str


@dataclass(frozen=True, slots=True)
class Durability:
    """Answer a write only once ``replicas`` replicas hold it, waiting at most ``timeout_ms``."""

    replicas: int
    timeout_ms: int

    def __post_init__(self) -> None:
        # WAIT with a timeout of 0 would block forever.
        if self.replicas < 1 or self.timeout_ms < 1:
            raise ValueError(f"durability needs replicas >= 1 and timeout_ms >= 1, got {self}")


class NotDurable(Exception):
    """A write script ran on the primary, but too few replicas acknowledged it in time.

    The write stands on the primary and may still replicate, or be lost with it: the caller
    must not report success. Repeating the request is safe (idempotency keys, compare-and-set
    transitions) and answers again once the write is replicated.
    """

    def __init__(self, script: ScriptName, *, acked: int, durability: Durability) -> None:
        super().__init__(
            f"{script} ran on the primary but was acknowledged by {acked} of "
            f"{durability.replicas} replicas within {durability.timeout_ms} ms"
        )
        self.script = script
        self.acked = acked
        self.durability = durability


def promises_a_write(reply: Any) -> bool:
    """Whether a script's (non-error) reply tells the caller that something was written."""
    if not isinstance(reply, list):
        return True
    if not reply:
        return False  # expire_due with nothing due
    return reply[0] not in NOTHING_PROMISED


def _refusal(exc: ResponseError) -> InvalidRequest | None:
    """Turn a script's error reply (``code: message``) into InvalidRequest, if it is one of ours."""
    code, sep, message = str(exc).partition(": ")
    if sep and code in ErrorCode._value2member_map_:
        return InvalidRequest(ErrorCode(code), message)
    return None


class Scripts:
    """Every script of the engine, ready to call on one Redis client (or one cluster's).

    ``durability`` None answers as soon as the primary ran the script ("fast").
    ``pipeliner``: sends the plain (not waited) calls, batched; ``redis`` still loads scripts.
    """

    def __init__(
        self,
        redis: RedisClient,
        *,
        durability: Durability | None = None,
        pipeliner: Pipeliner | ClusterPipeliner | None = None,
    ) -> None:
        self._redis = redis
        self._durability = durability
        self._pipeliner = pipeliner
        # On a cluster, a write and its WAIT go together to the node of the write's keys.
        self._nodes = pipeliner.nodes if isinstance(pipeliner, ClusterPipeliner) else None
        if durability is not None and isinstance(redis, RedisCluster) and self._nodes is None:
            raise ValueError("waiting for replicas on a cluster needs its ClusterPipeliner")
        self._scripts = {
            name: Script(name, src, hashlib.sha1(src.encode()).hexdigest())
            for name in ScriptName
            for src in [script_text(name)]
        }
        # Each script's histogram, found once: labels() sorts and locks on every call.
        self._durations = {
            name: metrics.REDIS_SCRIPT_DURATION.labels(script=name) for name in ScriptName
        }

    def __getitem__(self, name: ScriptName) -> Script:
        return self._scripts[name]

    async def load(self) -> None:
        """Load every script now, so the first purchase pays no load."""
        for script in self._scripts.values():
            await self._redis.script_load(script.source)

    @property
    def durability(self) -> Durability | None:
        return self._durability

    @property
    def pipeliner(self) -> Pipeliner | ClusterPipeliner | None:
        return self._pipeliner

    async def call(self, name: ScriptName, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """Run one script; its error reply of ours raises InvalidRequest, a write that too few
        replicas acknowledged raises NotDurable."""
        started = time.perf_counter()
        try:
            return await self._call(name, keys, args)
        finally:
            self._durations[name].observe(time.perf_counter() - started)

    async def _call(self, name: ScriptName, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        script = self._scripts[name]
        if self._durability is not None and name in WAITED_SCRIPTS:
            return await self._call_durably(script, keys, args, self._durability)
        try:
            try:
                return await self._evalsha(script, keys, args)
            except NoScriptError:
                await self._redis.script_load(script.source)
                return await self._evalsha(script, keys, args)
        except ResponseError as exc:
            refusal = _refusal(exc)
            if refusal is None:
                raise
            raise refusal from None

    def _evalsha(
        self, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]
    ) -> Awaitable[Any]:
        if self._pipeliner is None:
            return self._redis.evalsha(script.sha, len(keys), *keys, *args)
        return self._pipeliner.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _call_durably(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        durability: Durability,
    ) -> Any:
        # EVALSHA and WAIT in one pipeline: one round trip, on one connection, which is what WAIT
        # counts (the replicas that acknowledged this connection's writes so far). A replay
        # writes nothing, so it is checked against this connection's latest write: usually
        # later than the write it repeats, but not always (a connection idle since before it).
        # Error replies wrote nothing: they raise as in the plain path, whatever WAIT said.
        reply, acked = await self._evalsha_then_wait(script, keys, args, durability)
        if isinstance(reply, NoScriptError):
            await self._redis.script_load(script.source)
            reply, acked = await self._evalsha_then_wait(script, keys, args, durability)
        if isinstance(reply, ResponseError):
            refusal = _refusal(reply)
            if refusal is None:
                raise reply
            raise refusal from None
        if isinstance(acked, Exception):
            raise acked
        if acked < durability.replicas and promises_a_write(reply):
            raise NotDurable(script.name, acked=acked, durability=durability)
        return reply

    async def _evalsha_then_wait(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        durability: Durability,
    ) -> tuple[Any, Any]:
        if self._nodes is not None:
            evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
            wait = ("WAIT", durability.replicas, durability.timeout_ms)
            reply, acked = await send_on_node(self._nodes, keys[0], (evalsha, wait))
            return reply, acked
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.wait(durability.replicas, durability.timeout_ms)
            reply, acked = await pipe.execute(raise_on_error=False)
        return reply, acked
