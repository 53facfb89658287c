"""The durable copy of the registry of consumer groups that follow every item stream, part of
the ledger (``store/ledger.py``). Redis's registry (``engine/group_registry.py``) is the one the
readers use; this one outlives Redis, so recovery can make every registered group again on a
stream before it gives the stream its events back."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from seckill.store.tables import StreamGroup


class StreamGroupQueries:
    """Registering, listing and retiring the groups (the persister's is implied: never here)."""

    engine: AsyncEngine

    async def register_group(self, name: str) -> None:
        """Register ``name``; registering it again changes nothing."""
        async with self.engine.connect() as conn:
            known = await conn.execute(select(StreamGroup.name).where(StreamGroup.name == name))
            if known.first() is not None:
                return
        try:
            async with self.engine.begin() as conn:
                await conn.execute(
                    insert(StreamGroup).values(name=name, registered_at=datetime.now(UTC))
                )
        except IntegrityError:
            pass  # another reader of the group registered it in between

    async def stream_groups(self) -> list[str]:
        """The registered groups, by name."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(StreamGroup.name).order_by(StreamGroup.name))
            return [row.name for row in rows]

    async def retire_stream_group(self, name: str) -> bool:
        """Take ``name`` off the registry; whether it was on it."""
        async with self.engine.begin() as conn:
            gone = await conn.execute(delete(StreamGroup).where(StreamGroup.name == name))
            return bool(gone.rowcount)
