"""The one place that names Redis keys.

Every key of an item carries the hash tag ``{item:<id>}``, so a script touching them all stays in
one cluster slot. Scripts never build key names: they receive every key in KEYS.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

DEFAULT_PREFIX = "seckill"


@dataclass(frozen=True, slots=True)
class ItemKeys:
    item: str  # hash: total available held sold starts_at_ms ends_at_ms per_buyer_limit hold_ms
    buyers: str  # hash: buyer -> units held or paid
    holds: str  # hash: order id -> hold record (JSON)
    deadlines: str  # sorted set: held order ids scored by deadline (ms)
    events: str  # stream: one entry per state change, the outbox and journal
    dead_letters: str  # stream: entries the persister gave up on, with why
    idempotency_prefix: str

    def idempotency(self, buyer: str, key: str) -> str:
        """A buyer's idempotency record key.

        The buyer's length keeps ``a:b`` + ``c`` apart from ``a`` + ``b:c``.
        """
        return f"{self.idempotency_prefix}{len(buyer)}:{buyer}:{key}"

    def all_fixed(self) -> tuple[str, ...]:
        """Every key of the item but the idempotency records (which are one key each)."""
        return (self.item, self.buyers, self.holds, self.deadlines, self.events)


@lru_cache(maxsize=4096)
def item_keys(item_id: int, prefix: str = DEFAULT_PREFIX) -> ItemKeys:
    base = f"{prefix}:{{item:{item_id}}}"
    return ItemKeys(
        item=base,
        buyers=f"{base}:buyers",
        holds=f"{base}:holds",
        deadlines=f"{base}:deadlines",
        events=f"{base}:events",
        dead_letters=f"{base}:dead",
        idempotency_prefix=f"{base}:idem:",
    )


def item_pattern(item_id: int, prefix: str = DEFAULT_PREFIX) -> str:
    """A SCAN pattern matching every key of one item."""
    return f"{prefix}:{{item:{item_id}}}*"


def items_registry(prefix: str = DEFAULT_PREFIX) -> str:
    """A set of every item id ever loaded: how workers find the streams to follow."""
    return f"{prefix}:items"


def worker_id_key(worker_id: int, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}:worker-id:{worker_id}"
