"""Trimming the item streams: each keeps only what some consumer group still needs.

An entry is done with once every group of its stream has acknowledged it; a stream's trim point
is the lowest entry some group still needs (pending, or not delivered yet). The readers trim
(``seckill.engine.group_reader``): each the streams it acknowledged entries of, and now and then
every stream. Each trim reads and writes in pipelines, a few round trips however many streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from redis.exceptions import ResponseError

from seckill.domain.events import stream_position
from seckill.engine.cluster import RedisClient


async def acknowledged_below(redis: RedisClient, stream: str) -> str | None:
    """The lowest entry id some group of the stream still needs (pending, or not delivered
    yet); everything below it is done with. None: the stream has no group."""
    [below] = await acknowledged_below_each(redis, [stream])
    return below


async def acknowledged_below_each(redis: RedisClient, streams: Sequence[str]) -> list[str | None]:
    """``acknowledged_below`` of each stream, in order: two pipelines (XINFO GROUPS of each,
    then XPENDING of each group with entries pending). None: no such stream, or no group."""
    if not streams:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)
    groups_of: list[list[dict[str, Any]]] = []
    for reply in replies:
        if isinstance(reply, ResponseError):  # no such stream: nothing to trim
            reply = []
        elif isinstance(reply, Exception):
            raise reply
        groups_of.append(cast(list[dict[str, Any]], reply))
    pending = [
        (stream, group["name"])
        for stream, groups in zip(streams, groups_of, strict=True)
        for group in groups
        if group["pending"]
    ]
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    if pending:
        async with redis.pipeline(transaction=False) as pipe:
            for stream, name in pending:
                pipe.xpending(stream, name)
            summaries = dict(zip(pending, await pipe.execute(), strict=True))
    below: list[str | None] = []
    for stream, groups in zip(streams, groups_of, strict=True):
        needed: list[str] = []
        for group in groups:
            # Another consumer may acknowledge in between: no pending entry left is fine.
            summary = summaries.get((stream, group["name"])) or {}
            if summary.get("min"):
                needed.append(summary["min"])
            else:
                ms, seq = stream_position(group["last-delivered-id"])
                needed.append(f"{ms}-{seq + 1}")
        below.append(min(needed, key=stream_position) if needed else None)
    return below


async def trim_streams(redis: RedisClient, streams: Sequence[str]) -> None:
    """Drop the entries of each stream that every group of it has acknowledged (one XTRIM
    each, in one pipeline, after ``acknowledged_below_each``)."""
    trims = [
        (stream, below)
        for stream, below in zip(
            streams, await acknowledged_below_each(redis, streams), strict=True
        )
        if below is not None
    ]
    if trims:
        async with redis.pipeline(transaction=False) as pipe:
            for stream, below in trims:
                pipe.xtrim(stream, minid=below)
            await pipe.execute()
