"""Step reports carry the allocator's peak since the last sample and the GPU's capacity: what a batch size needed,
so the rebalancer predicts what a larger one will need before it raises (issue 15).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10 12:00:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: Union[str, Sequence[str], None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

REPORT_COLUMNS = ("peak_allocated_bytes", "total_bytes")


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in REPORT_COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in reversed(REPORT_COLUMNS):
            batch.drop_column(name)
