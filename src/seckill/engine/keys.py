"""The one place that names Redis keys.

Every key of an item carries the hash tag ``{item:<id>}``, so a script touching them all stays in
one cluster slot. An item with stock shards has one such set of keys per shard: shard 0 is the
item's own (``{item:<id>}``, also its head: the shard count lives there), shard k > 0 is
``{item:<id>:s<k>}``, another slot. Scripts never build key names: they receive every key in KEYS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

DEFAULT_PREFIX = "seckill"  # SECKILL_KEY_PREFIX's default (config.Settings.key_prefix)


@dataclass(frozen=True, slots=True)
class ItemKeys:
    item_id: int
    shard: int
    # hash: total available held sold starts_at_ms ends_at_ms per_buyer_limit hold_ms shards
    # (on a shard, total is the shard's: its opening stock plus transfers in, minus out)
    item: str
    buyers: str  # hash: buyer -> units held or paid
    holds: str  # hash: order id -> hold record (JSON)
    deadlines: str  # sorted set: held order ids scored by deadline (ms)
    events: str  # stream: one entry per state change, the outbox and journal
    dead_letters: str  # stream: entries a consumer group gave up on, with why
    payments: str  # hash: provider payment id -> the notice's answer (JSON), applied once
    # hash: "out:<id>" / "in:<id>" -> the stock transfer (JSON) this shard sent / received
    transfers: str
    in_transit: str  # sorted set: transfers sent and not yet known received, scored by ms sent
    idempotency_prefix: str
    rate_prefix: str

    def idempotency(self, buyer: str, key: str) -> str:
        """A buyer's idempotency record key.

        The buyer's length keeps ``a:b`` + ``c`` apart from ``a`` + ``b:c``.
        """
        return f"{self.idempotency_prefix}{len(buyer)}:{buyer}:{key}"

    def rate(self, buyer: str) -> str:
        """A buyer's purchase-attempt counter (hash: start, count; expires with its window).

        The buyer is the key's last part, so no length prefix is needed to keep it apart."""
        return f"{self.rate_prefix}{buyer}"

    def all_fixed(self) -> tuple[str, ...]:
        """Every key of the item but the idempotency records and rate counters (one key each)."""
        return (self.item, self.buyers, self.holds, self.deadlines, self.events)


@lru_cache(maxsize=4096)
def item_keys(item_id: int, prefix: str, shard: int = 0) -> ItemKeys:
    base = f"{prefix}:{{item:{item_id}}}" if shard == 0 else f"{prefix}:{{item:{item_id}:s{shard}}}"
    return ItemKeys(
        item_id=item_id,
        shard=shard,
        item=base,
        buyers=f"{base}:buyers",
        holds=f"{base}:holds",
        deadlines=f"{base}:deadlines",
        events=f"{base}:events",
        dead_letters=f"{base}:dead",
        payments=f"{base}:payments",
        transfers=f"{base}:transfers",
        in_transit=f"{base}:in-transit",
        idempotency_prefix=f"{base}:idem:",
        rate_prefix=f"{base}:rate:",
    )


@lru_cache(maxsize=65_536)
def encoded(key: str) -> bytes:
    """A key as sent. redis-py packs bytes in about two thirds the time of str, which counts in
    the commands that name every stream each pass (the reaper's XREAD, a consumer's XREADGROUP:
    2,000 arguments with 1,000 items on sale)."""
    return key.encode()


def item_pattern(item_id: int, prefix: str, shard: int = 0) -> str:
    """A SCAN pattern matching every key of one item's shard (shard 0: the item's own)."""
    return item_keys(item_id, prefix, shard).item + "*"


_SHARD_TAG = re.compile(r":s(\d+)\}")


def shard_of(key: str) -> int:
    """The stock shard a key of an item belongs to (0: the item's own keys)."""
    found = _SHARD_TAG.search(key)
    return int(found.group(1)) if found else 0


def items_registry(prefix: str) -> str:
    """A set of every item id ever loaded: how workers find the streams to follow."""
    return f"{prefix}:items"


def stream_groups_registry(prefix: str) -> str:
    """A set of the consumer groups that follow every item stream (the persister's, each
    bridge's): every reader registers its own and makes each registered group on a stream it
    finds, so no entry is trimmed before a group that follows the streams has it."""
    return f"{prefix}:groups"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """An item's waiting room, in the item's own slot (beside its head, where the sale window is
    read from)."""

    item: str  # the item's head: starts_at_ms, ends_at_ms
    # hash: sealed (how many joined before the start, fixed at the start), late (how many since),
    # admitted (the highest position let in), last_ms and credit (the inlet's rate bookkeeping)
    queue: str
    early: str  # sorted set: buyers who joined before the start, scored by a random draw
    late: str  # hash: buyer who joined after the start -> "<position>:<joined at ms>"
    admissions: str  # stream: one entry per advance, {upto}: its id's time is when

    def all(self) -> tuple[str, ...]:
        """Every key of the queue, in the order the queue scripts take them."""
        return (self.item, self.queue, self.early, self.late, self.admissions)


@lru_cache(maxsize=4096)
def queue_keys(item_id: int, prefix: str) -> QueueKeys:
    base = item_keys(item_id, prefix).item
    return QueueKeys(
        item=base,
        queue=f"{base}:queue",
        early=f"{base}:queue:early",
        late=f"{base}:queue:late",
        admissions=f"{base}:queue:admissions",
    )


def queues_registry(prefix: str) -> str:
    """A set of the item ids whose waiting room someone joined: what the inlet advances."""
    return f"{prefix}:queues"


def fenced_registry(prefix: str) -> str:
    """A set of the items a detector fenced, or left fenced, since the fence check last looked
    (see ``EngineRepairs.fence_look``): what it checks between changes of the servers."""
    return f"{prefix}:fenced"


def upkeep_lock_key(job: str, prefix: str) -> str:
    """String (an owner token, PX): held by the one process doing ``job`` (the reconciler)."""
    return f"{prefix}:upkeep:{job}"


def worker_id_key(worker_id: int, prefix: str) -> str:
    return f"{prefix}:worker-id:{worker_id}"


def item_card_key(item_id: int, prefix: str) -> str:
    """String (JSON, expires): the item as buyers see it, cached from SQL by
    ``seckill.services.item_cache``. In the item's slot; no script touches it."""
    return f"{prefix}:{{item:{item_id}}}:card"


def item_card_lock_key(item_id: int, prefix: str) -> str:
    """String (an owner token, PX): held by the one process loading the item's card from SQL."""
    return f"{prefix}:{{item:{item_id}}}:card:lock"


def item_card_keys(item_id: int, prefix: str) -> tuple[str, str]:
    """The item's card and its lock: what archiving removes beside the item's own keys."""
    return item_card_key(item_id, prefix), item_card_lock_key(item_id, prefix)
