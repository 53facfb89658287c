"""The consumer groups that follow every item stream, kept in SQL too: Redis's registry of them
dies with Redis, and recovery makes each registered group again before it gives events back.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from seckill.store.tables import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stream_groups",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_stream_groups")),
    )


def downgrade() -> None:
    op.drop_table("stream_groups")
