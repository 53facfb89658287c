"""Charges with their sums: items have a currency, a refund owed is of the sum charged (in its
currency, for an order that may be unknown), and an archived item's notices keep their charge.
Reasons grow to 32 characters (``currency_mismatch``).

Items already on record get the deployment's currency (``SECKILL_CURRENCY``, handed over by
``seckill.store.migrate``), and their refunds their item's.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from seckill.domain.rules import DEFAULT_CURRENCY

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

REASONS = {"stock_flow": True, "refunds": False, "payments": True}  # table -> reason nullable


def upgrade() -> None:
    currency = context.config.attributes.get("currency", DEFAULT_CURRENCY)
    with op.batch_alter_table("items") as batch_op:
        batch_op.add_column(
            sa.Column("currency", sa.String(length=3), nullable=False, server_default=currency)
        )
    with op.batch_alter_table("items") as batch_op:
        batch_op.alter_column("currency", server_default=None, existing_type=sa.String(3))
    with op.batch_alter_table("refunds") as batch_op:
        batch_op.add_column(sa.Column("currency", sa.String(length=3), nullable=True))
    op.execute(
        "UPDATE refunds SET currency = (SELECT items.currency FROM items"
        " WHERE items.id = refunds.item_id)"
    )
    op.execute(f"UPDATE refunds SET currency = '{currency}' WHERE currency IS NULL")
    with op.batch_alter_table("refunds") as batch_op:
        batch_op.alter_column("currency", nullable=False, existing_type=sa.String(3))
        # A refund for an order nobody knows names no buyer and no quantity.
        batch_op.alter_column("buyer", nullable=True, existing_type=sa.String(64))
        batch_op.alter_column("quantity", nullable=True, existing_type=sa.Integer())
    with op.batch_alter_table("payments") as batch_op:
        batch_op.add_column(sa.Column("amount_cents", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("currency", sa.String(length=3), nullable=True))
    for table, nullable in REASONS.items():
        with op.batch_alter_table(table) as batch_op:
            batch_op.alter_column(
                "reason",
                type_=sa.String(32),
                existing_type=sa.String(16),
                existing_nullable=nullable,
            )


def downgrade() -> None:
    for table, nullable in REASONS.items():
        with op.batch_alter_table(table) as batch_op:
            batch_op.alter_column(
                "reason",
                type_=sa.String(16),
                existing_type=sa.String(32),
                existing_nullable=nullable,
            )
    with op.batch_alter_table("payments") as batch_op:
        batch_op.drop_column("currency")
        batch_op.drop_column("amount_cents")
    with op.batch_alter_table("refunds") as batch_op:
        batch_op.alter_column("quantity", nullable=False, existing_type=sa.Integer())
        batch_op.alter_column("buyer", nullable=False, existing_type=sa.String(64))
        batch_op.drop_column("currency")
    with op.batch_alter_table("items") as batch_op:
        batch_op.drop_column("currency")
