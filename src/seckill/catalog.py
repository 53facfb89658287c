"""Items start in SQL; warming copies one into Redis so it can be sold."""

from __future__ import annotations

from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.store.ledger import Ledger


class UnknownItem(LookupError):
    pass


async def warm_item(
    engine: RedisEngine, ledger: Ledger, item_id: int, *, force: bool = False
) -> Outcome:
    """Load the item as SQL records it into Redis. An item with holds or sales in Redis is
    refused (``item_active``) unless forced, and even then keeps them (see load_item.lua)."""
    item = await ledger.sale_item(item_id)
    if item is None:
        raise UnknownItem(f"item {item_id} is not in the database")
    return await engine.load_item(item, force=force)
