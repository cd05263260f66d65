"""Step reports carry the GPU time of each phase beside its wall time (CUDA events the hook records around phase
blocks), so step composition is graded on what the GPU did, not on when Python returned (issue 22).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 18:30:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: Union[str, Sequence[str], None] = "0007"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

REPORT_COLUMNS = ("gpu_generation_s", "gpu_evaluation_s", "gpu_communication_s", "gpu_update_s",
                  "gpu_validation_s", "gpu_checkpoint_s")


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in REPORT_COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in reversed(REPORT_COLUMNS):
            batch.drop_column(name)
