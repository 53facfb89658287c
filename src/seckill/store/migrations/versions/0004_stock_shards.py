"""Stock shards: an item's shard count, and a journal whose events come from several streams.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("stock_shards", sa.Integer(), nullable=False, server_default="1")
        )
        batch_op.create_check_constraint(
            op.f("ck_items_stock_shards"), "stock_shards >= 1 AND stock_shards <= 64"
        )
    # An entry id is unique within one stream: with shards, the journal keys events by shard too.
    with op.batch_alter_table("stock_flow", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shard", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("transfer_id", sa.String(length=64), nullable=True))
        batch_op.drop_constraint("uq_stock_flow_item_id_event_id", type_="unique")
        batch_op.create_unique_constraint(
            op.f("uq_stock_flow_item_id_shard_event_id"), ["item_id", "shard", "event_id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("stock_flow", schema=None) as batch_op:
        batch_op.drop_constraint("uq_stock_flow_item_id_shard_event_id", type_="unique")
        batch_op.create_unique_constraint(
            op.f("uq_stock_flow_item_id_event_id"), ["item_id", "event_id"]
        )
        batch_op.drop_column("transfer_id")
        batch_op.drop_column("shard")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_items_stock_shards"), type_="check")
        batch_op.drop_column("stock_shards")
