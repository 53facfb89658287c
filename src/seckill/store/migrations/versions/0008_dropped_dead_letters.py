"""A dead letter a person decided not to land is marked dropped, kept for the record.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from seckill.store.tables import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dropped_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.drop_column("dropped_at")
