"""Archiving: an item's archived time, and payment notices of archived items.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from seckill.store.tables import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("archived_at", UTCDateTime(), nullable=True))
    op.create_table(
        "payments",
        sa.Column("payment_id", sa.String(length=64), nullable=False),
        sa.Column("item_id", sa.BigInteger(), nullable=False),
        sa.Column("order_id", sa.BigInteger(), nullable=False),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=True),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("payment_id", name=op.f("pk_payments")),
    )
    op.create_index(op.f("ix_payments_order_id"), "payments", ["order_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_payments_order_id"), table_name="payments")
    op.drop_table("payments")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("archived_at")
