"""The accumulated GPU-time ledger behind /metrics' counters (issue 40): GPU-seconds of each job's GPUs by role and
phase (busy) or cause (idle), added up from the moment the ledger first saw the job, and per job the time up to
which it has been added (so each advance adds only the time since, and a counter never goes down).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 03:00:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: Union[str, Sequence[str], None] = "0020"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "job_ledger_state",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", name="fk_job_ledger_state_job_id_jobs",
                                                        ondelete="CASCADE"), nullable=False),
        sa.Column("through_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_ledger_state"),
    )
    op.create_table(
        "job_gpu_ledger",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", name="fk_job_gpu_ledger_job_id_jobs",
                                                        ondelete="CASCADE"), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("role", sa.String(255), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("waiting_for", sa.String(255), nullable=False),
        sa.Column("gpu_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "hostname", "gpu_index", "kind", "role", "name", "waiting_for",
                                name="pk_job_gpu_ledger"),
    )


def downgrade() -> None:
    op.drop_table("job_gpu_ledger")
    op.drop_table("job_ledger_state")
