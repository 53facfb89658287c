"""The consumer groups that follow every item stream (``engine/group_reader.py``), as an
operator sees them: which are registered, and retiring one taken out of service for good (a
bridge to a broker the shop no longer uses), so the streams stop keeping what it never reads."""

from __future__ import annotations

from seckill.domain.dead_letters import PERSISTER_GROUP
from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.engine.engine import RedisEngine
from seckill.engine.group_reader import registered_groups, retire_group


async def list_groups(engine: RedisEngine) -> list[str]:
    return await registered_groups(engine.redis, engine.prefix)


async def retire(engine: RedisEngine, group: str) -> int:
    """Retire ``group``: off the registry and every item stream; returns the streams it left.
    The persister's group is refused (SQL would stop receiving orders), as is a group that is
    not registered (a typo would otherwise look like success)."""
    if group == PERSISTER_GROUP:
        raise InvalidRequest(ErrorCode.INVALID_GROUP, "the persister's group lands every order")
    groups = await list_groups(engine)
    if group not in groups:
        known = ", ".join(groups) or "none"
        raise InvalidRequest(ErrorCode.INVALID_GROUP, f"no group {group!r} (registered: {known})")
    return await retire_group(engine.redis, engine.prefix, group)
