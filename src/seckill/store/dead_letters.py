"""The persister's dead letters in SQL (entries it gave up on), part of the ledger
(``store/ledger.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from seckill.domain.dead_letters import PERSISTER_GROUP, DeadLetter
from seckill.store.tables import DeadLetter as DeadLetterRow


class DeadLetterQueries:
    """Recording, listing, counting and settling (replayed, dropped) dead letters."""

    engine: AsyncEngine

    async def add_dead_letter(
        self, *, stream: str, entry_id: str, payload: dict[str, str], error: str, deliveries: int
    ) -> None:
        """Record an entry given up on. Recording the same entry twice keeps the first."""
        async with self.engine.begin() as conn:
            known = await conn.execute(
                select(DeadLetterRow.id).where(
                    DeadLetterRow.stream == stream, DeadLetterRow.entry_id == entry_id
                )
            )
            if known.first() is None:
                await conn.execute(
                    insert(DeadLetterRow).values(
                        stream=stream,
                        entry_id=entry_id,
                        payload=json.dumps(payload, sort_keys=True),
                        error=error[:4000],
                        deliveries=deliveries,
                        created_at=datetime.now(UTC),
                    )
                )

    async def dead_letters(self, *, include_settled: bool = False) -> list[DeadLetter]:
        """The persister's dead letters, oldest first: pending ones only unless
        ``include_settled`` (replayed or dropped too)."""
        query = select(DeadLetterRow).order_by(DeadLetterRow.id)
        if not include_settled:
            query = query.where(_pending_letter())
        async with self.engine.connect() as conn:
            rows = await conn.execute(query)
            return [_letter(row) for row in rows]

    async def dead_letters_of(
        self, entries: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], DeadLetter]:
        """The persister's dead letters, settled or not, of these (stream, entry id) pairs."""
        if not entries:
            return {}
        wanted = set(entries)
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(DeadLetterRow).where(
                    DeadLetterRow.stream.in_({stream for stream, _ in wanted}),
                    DeadLetterRow.entry_id.in_({entry_id for _, entry_id in wanted}),
                )
            )
            letters = [_letter(row) for row in rows]
        return {
            (letter.stream, letter.entry_id): letter
            for letter in letters
            if (letter.stream, letter.entry_id) in wanted
        }

    async def dead_letter_count(self, stream: str) -> int:
        """Pending dead letters of one stream."""
        return (await self.dead_letter_counts([stream]))[stream]

    async def dead_letter_counts(self, streams: Sequence[str]) -> dict[str, int]:
        """``dead_letter_count`` of many streams (0 for one with none), in one statement."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(DeadLetterRow.stream, func.count())
                .where(DeadLetterRow.stream.in_(streams), _pending_letter())
                .group_by(DeadLetterRow.stream)
            )
            counted = {stream: int(count) for stream, count in rows}
        return {stream: counted.get(stream, 0) for stream in streams}

    async def mark_replayed(self, dead_letter_id: int) -> None:
        await self._settle_letter(dead_letter_id, replayed_at=datetime.now(UTC))

    async def mark_dropped(self, dead_letter_id: int) -> None:
        await self._settle_letter(dead_letter_id, dropped_at=datetime.now(UTC))

    async def _settle_letter(self, dead_letter_id: int, **settled: datetime) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(DeadLetterRow)
                .where(DeadLetterRow.id == dead_letter_id, _pending_letter())
                .values(**settled)
            )


def _pending_letter() -> Any:
    return DeadLetterRow.replayed_at.is_(None) & DeadLetterRow.dropped_at.is_(None)


def _letter(r: Any) -> DeadLetter:
    return DeadLetter(
        id=str(r.id), group=PERSISTER_GROUP, stream=r.stream, entry_id=r.entry_id,
        payload=json.loads(r.payload), error=r.error, deliveries=r.deliveries,
        died_at=r.created_at, replayed_at=r.replayed_at, dropped_at=r.dropped_at,
    )  # fmt: skip
