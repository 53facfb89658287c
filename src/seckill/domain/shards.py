"""Stock shards: one item's stock split over several Redis slots, so several primaries sell it.

A buyer always buys on one shard, their *home* (a hash of the buyer id): the per-buyer limit,
the idempotency keys, the rate window and every order of that buyer live there, so each purchase
is still decided by one script on one slot. Stock is what moves: a home shard that runs dry takes
units from another shard by a transfer (see ``engine.engine`` and docs/operations/stock-shards.md).
"""

from __future__ import annotations

from zlib import crc32

from seckill.domain.rules import MAX_STOCK_SHARDS

__all__ = ["MAX_STOCK_SHARDS", "home_shard", "split_stock"]


def home_shard(buyer: str, shards: int) -> int:
    """The shard that holds ``buyer``'s orders, count and keys (stable across processes)."""
    return 0 if shards == 1 else crc32(buyer.encode()) % shards


def split_stock(total: int, shards: int) -> list[int]:
    """Each shard's opening stock: as even as whole units allow, the first shards one more."""
    share, rest = divmod(total, shards)
    return [share + (1 if shard < rest else 0) for shard in range(shards)]
