"""Step reports keep what a framework logs for the step (TRL: prompts and completions named as such, mean
completion length, mean reward, and its other logged scalars by name); a job may say why it declares no knobs.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 12:00:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, Sequence[str], None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

REPORT_COLUMNS = (("prompts", sa.BigInteger), ("completions", sa.BigInteger), ("completion_mean_tokens", sa.Double),
                  ("reward_mean", sa.Double), ("logged", sa.JSON))


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name, kind in REPORT_COLUMNS:
            batch.add_column(sa.Column(name, kind(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("advise_only_reason", sa.String(1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("advise_only_reason")
    with op.batch_alter_table("job_reports") as batch:
        for name, _ in reversed(REPORT_COLUMNS):
            batch.drop_column(name)
