"""The rebalancer's latest word on each job (its last plan's note and the gate that held it, whether planning the
job fails and since when) and the job's events (planning failed, planning recovered): issue 38, no job left
unplanned in silence.

Revision ID: 0016
Revises: 0011
Create Date: 2026-12-05 23:20:00

Frozen like every revision: it names its tables and columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: Union[str, Sequence[str], None] = "0015"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_plan_status",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True,
                  autoincrement=False),
        sa.Column("planned_ms", sa.BigInteger(), nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("gate", sa.JSON(), nullable=True),
        sa.Column("failing_since_ms", sa.BigInteger(), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("errors_total", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("last_error", sa.JSON(), nullable=True),
        sa.Column("retry_at_ms", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "job_events",
        sa.Column("id", _BIG_ID, primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index(op.f("ix_job_events_job_id_ts_ms"), "job_events", ["job_id", "ts_ms"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_job_events_job_id_ts_ms"), table_name="job_events")
    op.drop_table("job_events")
    op.drop_table("job_plan_status")
