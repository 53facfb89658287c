"""The dead-letter streams: each item stream (each shard's) has one, where a consumer group puts
the entries it gave up on (``seckill.domain.dead_letters``). A letter here is named by its item,
shard and id on that stream, and leaves it when a person replays or drops it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

from seckill.domain.dead_letters import DeadLetter, dead_letter_fields, read_dead_letter
from seckill.domain.times import ms_to_datetime
from seckill.engine.cluster import RedisClient
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import ItemKeys

_LETTER_ID = re.compile(r"(\d+):(\d+):(\d+-\d+)")


def letter_id(keys: ItemKeys, dead_id: str) -> str:
    """The name of a letter on a shard's dead-letter stream: ``<item>:<shard>:<its id>``."""
    return f"{keys.item_id}:{keys.shard}:{dead_id}"


def parse_letter_id(name: str) -> tuple[int, int, str] | None:
    """Item, shard and dead-letter stream id of a letter's name; None if it names none."""
    found = _LETTER_ID.fullmatch(name)
    return None if found is None else (int(found[1]), int(found[2]), found[3])


async def add_dead_letter(
    redis: RedisClient,
    keys: ItemKeys,
    *,
    entry_id: str,
    fields: dict[str, str],
    group: str,
    error: str,
    deliveries: int,
) -> str:
    """Put an entry of ``keys``' stream that ``group`` gave up on on the shard's dead-letter
    stream (its fields, and who gave up, why, after how many deliveries); returns the letter's
    id there."""
    dead = dead_letter_fields(
        fields, entry_id=entry_id, group=group, error=error, deliveries=deliveries
    )
    return str(await redis.xadd(keys.dead_letters, cast(Any, dead)))


async def read_dead_letters(
    engine: RedisEngine, item_ids: Sequence[int] | None = None
) -> list[DeadLetter]:
    """Every letter on the dead-letter streams of these items (default: every item this Redis
    knows), item by item, shard by shard, oldest first."""
    letters = []
    for item_id in await engine.item_ids() if item_ids is None else item_ids:
        for keys in await engine.shard_keys(item_id):
            entries = await engine.redis.xrange(keys.dead_letters)
            for dead_id, fields in cast(list[tuple[str, dict[str, str]]], entries):
                letters.append(
                    read_dead_letter(
                        letter_id(keys, dead_id),
                        fields,
                        stream=keys.events,
                        died_at=ms_to_datetime(int(dead_id.partition("-")[0])),
                    )
                )
    return letters


async def delete_dead_letter(engine: RedisEngine, name: str) -> bool:
    """Take a letter off its dead-letter stream; False if it is not there."""
    parsed = parse_letter_id(name)
    if parsed is None:
        return False
    item_id, shard, dead_id = parsed
    return bool(await engine.redis.xdel(engine.keys(item_id, shard).dead_letters, dead_id))
