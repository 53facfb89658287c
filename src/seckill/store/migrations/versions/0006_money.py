"""Money: a payment id is unique within its item, each paid order keeps its payment, and every
refund owed is a row of its own.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from seckill.store.tables import BigId, UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.add_column(sa.Column("payment_id", sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(
            op.f("uq_orders_item_id_payment_id"), ["item_id", "payment_id"]
        )
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.drop_constraint("pk_payments", type_="primary")
        batch_op.create_primary_key("pk_payments", ["item_id", "payment_id"])
    op.create_table(
        "refunds",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("item_id", sa.BigInteger(), nullable=False),
        sa.Column("payment_id", sa.String(length=64), nullable=False),
        sa.Column("order_id", sa.BigInteger(), nullable=False),
        sa.Column("buyer", sa.String(length=64), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(length=41), nullable=False),
        sa.Column("owed_at", UTCDateTime(), nullable=False),
        sa.Column("refunded_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_refunds")),
        sa.UniqueConstraint("item_id", "payment_id", name=op.f("uq_refunds_item_id_payment_id")),
    )
    op.create_index(op.f("ix_refunds_order_id"), "refunds", ["order_id"])
    op.create_index(op.f("ix_refunds_refunded_at_id"), "refunds", ["refunded_at", "id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_refunds_refunded_at_id"), table_name="refunds")
    op.drop_index(op.f("ix_refunds_order_id"), table_name="refunds")
    op.drop_table("refunds")
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.drop_constraint("pk_payments", type_="primary")
        batch_op.create_primary_key("pk_payments", ["payment_id"])
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("uq_orders_item_id_payment_id"), type_="unique")
        batch_op.drop_column("payment_id")
