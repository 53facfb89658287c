"""The waiting room per item: whether an item has one, and its own pace and opening lead.

Items recorded before this revision have none (the deployment-wide SECKILL_WAITING_ROOM is the
default for new items only); their pace and lead are the deployment's.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("waiting_room", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("queue_admit_per_second", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("queue_open_seconds", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("queue_open_seconds")
        batch_op.drop_column("queue_admit_per_second")
        batch_op.drop_column("waiting_room")
