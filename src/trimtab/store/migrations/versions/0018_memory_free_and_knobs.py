"""Step reports carry the free memory of the rank's GPU as the job sees it (memory another process holds lowers the
line the memory model plans against, issue 38) and the knob values the step ran at (after the hook's own OOM
halving no change records the new batch size: the memory fit labelled the steps run at 35 as batch 71).

Revision ID: 0018
Revises: 0011
Create Date: 2026-12-05 23:30:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: Union[str, Sequence[str], None] = "0016"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

REPORT_COLUMNS = (("free_bytes", sa.BigInteger()), ("knobs", sa.JSON()))


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name, kind in REPORT_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name, _ in reversed(REPORT_COLUMNS):
            batch.drop_column(name)
