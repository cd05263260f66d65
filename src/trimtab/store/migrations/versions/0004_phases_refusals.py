"""Step reports gain the phases a real trainer has beyond the four of the reference pipeline — validation,
checkpointing, waiting for rollout — and the rollout's long tail (slowest vs mean sample); a knob change may be
refused by the code that owns the knob, with its reason.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 09:00:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: Union[str, Sequence[str], None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

REPORT_COLUMNS = ("validation_s", "checkpoint_s", "wait_s", "rollout_slowest_s", "rollout_mean_s")


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in REPORT_COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
    with op.batch_alter_table("knob_changes") as batch:
        batch.add_column(sa.Column("refused_reason", sa.String(1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("knob_changes") as batch:
        batch.drop_column("refused_reason")
    with op.batch_alter_table("job_reports") as batch:
        for name in REPORT_COLUMNS:
            batch.drop_column(name)
