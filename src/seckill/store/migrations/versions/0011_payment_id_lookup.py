"""A payment id looked up across items: the reconciler finds one provider charge that paid or is
owed back on two items (payment ids are scoped per item; a provider's are global).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TABLES = ("orders", "refunds", "payments")


def upgrade() -> None:
    for table in TABLES:
        op.create_index(op.f(f"ix_{table}_payment_id"), table, ["payment_id"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(op.f(f"ix_{table}_payment_id"), table_name=table)
