"""Revision 0009 (the waiting room per item) upgrades a database that already holds items."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from seckill.store.database import create_database, drop_database, open_database
from seckill.store.ledger import Ledger
from seckill.store.migrate import upgrade
from seckill.store.tables import UTCDateTime
from tests.conftest import SERVER_URLS, SQL_BACKENDS


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_items_recorded_before_0009_have_no_waiting_room_after_it(
    backend: str, tmp_path: Path
) -> None:
    name = f"seckill_0009_{secrets.token_hex(3)}"
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    else:
        url = await create_database(SERVER_URLS[backend], name)
    engine = open_database(url)
    # The items table as revision 0008 left it: no waiting room columns.
    items = sa.table(
        "items",
        *(sa.column(c) for c in ("name", "price_cents", "total", "per_buyer_limit")),
        *(sa.column(c) for c in ("hold_seconds", "stock_shards")),
        *(sa.column(c, UTCDateTime()) for c in ("starts_at", "ends_at", "created_at")),
    )
    try:
        await upgrade(engine, "0008")
        now = datetime.now(UTC)
        async with engine.begin() as conn:
            await conn.execute(
                items.insert().values(
                    name="old", price_cents=100, total=5, per_buyer_limit=1, hold_seconds=60,
                    stock_shards=1, starts_at=now, ends_at=now + timedelta(hours=1),
                    created_at=now,
                )
            )  # fmt: skip
        await upgrade(engine)
        record = await Ledger(engine).item(1)
        assert record is not None and (record.name, record.waiting_room) == ("old", False)
        assert (record.queue_admit_per_second, record.queue_open_seconds) == (None, None)
    finally:
        await engine.dispose()
        if backend != "sqlite":
            await drop_database(SERVER_URLS[backend], name)
