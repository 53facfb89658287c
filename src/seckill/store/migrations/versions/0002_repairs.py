"""The reconciler's repair journal.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import seckill.store.tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "repairs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("item_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_repairs")),
    )
    with op.batch_alter_table("repairs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_repairs_item_id"), ["item_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("repairs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_repairs_item_id"))
    op.drop_table("repairs")
