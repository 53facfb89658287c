"""Initial schema: items, inventory, orders, the stock-flow journal and dead letters.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import seckill.store.tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("stream", sa.String(length=200), nullable=False),
        sa.Column("entry_id", sa.String(length=41), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("created_at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.Column("replayed_at", seckill.store.tables.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
        sa.UniqueConstraint("stream", "entry_id", name=op.f("uq_dead_letters_stream_entry_id")),
    )
    op.create_table(
        "items",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("price_cents", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("starts_at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.Column("ends_at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.Column("per_buyer_limit", sa.Integer(), nullable=False),
        sa.Column("hold_seconds", sa.Integer(), nullable=False),
        sa.Column("created_at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.CheckConstraint("hold_seconds >= 1", name=op.f("ck_items_hold_seconds")),
        sa.CheckConstraint("per_buyer_limit >= 1", name=op.f("ck_items_per_buyer_limit")),
        sa.CheckConstraint("price_cents >= 0", name=op.f("ck_items_price")),
        sa.CheckConstraint("starts_at < ends_at", name=op.f("ck_items_window")),
        sa.CheckConstraint("total >= 0", name=op.f("ck_items_total")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_items")),
    )
    op.create_table(
        "stock_flow",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("item_id", sa.BigInteger(), nullable=False),
        sa.Column("event_id", sa.String(length=41), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("order_id", sa.BigInteger(), nullable=True),
        sa.Column("quantity", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=16), nullable=True),
        sa.Column("at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.Column("available_delta", sa.BigInteger(), nullable=False),
        sa.Column("held_delta", sa.BigInteger(), nullable=False),
        sa.Column("sold_delta", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stock_flow")),
        sa.UniqueConstraint("item_id", "event_id", name=op.f("uq_stock_flow_item_id_event_id")),
    )
    with op.batch_alter_table("stock_flow", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_stock_flow_order_id"), ["order_id"], unique=False)

    op.create_table(
        "inventory",
        sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("available", sa.BigInteger(), nullable=False),
        sa.Column("held", sa.BigInteger(), nullable=False),
        sa.Column("sold", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("loaded_position", sa.String(length=41), nullable=False),
        sa.CheckConstraint("available + held + sold = total", name=op.f("ck_inventory_balanced")),
        sa.CheckConstraint("available >= 0", name=op.f("ck_inventory_available")),
        sa.CheckConstraint("held >= 0", name=op.f("ck_inventory_held")),
        sa.CheckConstraint("sold >= 0", name=op.f("ck_inventory_sold")),
        sa.ForeignKeyConstraint(["item_id"], ["items.id"], name=op.f("fk_inventory_item_id_items")),
        sa.PrimaryKeyConstraint("item_id", name=op.f("pk_inventory")),
    )
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("buyer", sa.String(length=64), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("price_cents", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("release_reason", sa.String(length=16), nullable=True),
        sa.Column("deadline_at", seckill.store.tables.UTCDateTime(), nullable=True),
        sa.Column("reserved_at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.Column("paid_at", seckill.store.tables.UTCDateTime(), nullable=True),
        sa.Column("released_at", seckill.store.tables.UTCDateTime(), nullable=True),
        sa.Column("updated_at", seckill.store.tables.UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "status IN ('held', 'paid', 'released', 'refund_required')",
            name=op.f("ck_orders_status"),
        ),
        sa.CheckConstraint("quantity >= 1", name=op.f("ck_orders_quantity")),
        sa.ForeignKeyConstraint(["item_id"], ["items.id"], name=op.f("fk_orders_item_id_items")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_orders")),
    )
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_orders_item_id_buyer"), ["item_id", "buyer"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_orders_item_id_status"), ["item_id", "status"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_orders_item_id_status"))
        batch_op.drop_index(batch_op.f("ix_orders_item_id_buyer"))

    op.drop_table("orders")
    op.drop_table("inventory")
    with op.batch_alter_table("stock_flow", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_stock_flow_order_id"))

    op.drop_table("stock_flow")
    op.drop_table("items")
    op.drop_table("dead_letters")
