"""Alembic environment: migrations run on the connection seckill.store.migrate hands over."""

from __future__ import annotations

from alembic import context

from seckill.store.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `seckill db upgrade` (seckill.store.migrate)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # SQLite alters tables by copying them
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
