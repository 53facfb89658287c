"""The consumer groups that follow every item stream (``seckill.engine.group_registry``), as an
operator sees them: which are registered, and retiring one taken out of service for good (a
bridge to a broker the shop no longer uses), so the streams stop keeping what it never reads.

Redis's registry is the one the readers use; SQL keeps a durable copy (a bridge registers its
group there as it starts; the persister's is always registered), which recovery puts back into
Redis, making each group on the streams it rebuilds, before it gives them their events back."""

from __future__ import annotations

from seckill.domain.dead_letters import PERSISTER_GROUP
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.engine.engine import RedisEngine
from seckill.engine.group_registry import register_groups, registered_groups, retire_group
from seckill.store.ledger import Ledger


async def list_groups(engine: RedisEngine, ledger: Ledger) -> list[str]:
    """Every registered group, in Redis's registry or SQL's (after Redis lost everything, the
    readers put theirs back in Redis as they go on, recovery the others)."""
    return sorted(
        {*await registered_groups(engine.redis, engine.prefix), *await ledger.stream_groups()}
    )


async def retire(engine: RedisEngine, ledger: Ledger, group: str) -> int:
    """Retire ``group``: off both registries and every item stream; returns the streams it
    left. The persister's group is refused (SQL would stop receiving orders), as is a group that
    is not registered (a typo would otherwise look like success)."""
    if group == PERSISTER_GROUP:
        raise InvalidRequest(ErrorCode.INVALID_GROUP, "the persister's group lands every order")
    groups = await list_groups(engine, ledger)
    if group not in groups:
        known = ", ".join(groups) or "none"
        raise InvalidRequest(ErrorCode.INVALID_GROUP, f"no group {group!r} (registered: {known})")
    # SQL's first: a recovery after a retire that stopped halfway must not bring it back.
    await ledger.retire_stream_group(group)
    return await retire_group(engine.redis, engine.prefix, group)


async def give_back_groups(engine: RedisEngine, ledger: Ledger, item_id: int, shards: int) -> None:
    """Every group SQL registered, and the persister's, back in Redis's registry and on each of
    the item's shard streams (from its first entry, with the stream if missing): before a
    recovery gives the streams their events back, so no trim drops one a group has not read."""
    groups = sorted({PERSISTER_GROUP, *await ledger.stream_groups()})
    streams = [engine.keys(item_id, shard).events for shard in range(shards)]
    await register_groups(engine.redis, engine.prefix, groups, streams)
