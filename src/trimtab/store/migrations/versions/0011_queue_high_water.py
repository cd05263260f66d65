"""Step reports carry the prefetch queue's high-water mark (the most generated batches that waited unclaimed at
once in the step): where it stays below the queue's depth, a deeper queue would stay empty, and the rebalancer does
not try one (``control/queue_use.py``; on the H200 reference pipeline it was 1 at prefetch 2 and at 4).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 21:00:00

Frozen like every revision: it names its column itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: Union[str, Sequence[str], None] = "0010"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        batch.add_column(sa.Column("queue_high_water", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        batch.drop_column("queue_high_water")
