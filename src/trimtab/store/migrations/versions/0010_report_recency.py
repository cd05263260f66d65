"""A job's newest report found by an index seek, not a scan of all its reports (issue 20: report latency).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 02:10:00

Every read of a job (``get_job``: each report, ack and refusal, the job routes; ``list_jobs``: the rebalancer's
sweep, ``/metrics``) computes ``max(received_ms)`` of the job's reports. The only index with ``job_id`` first was
the unique (job_id, step, rank), so that maximum read every report the job ever sent: 26 ms per read on SQLite at
200 000 reports, which is one long job with 8 ranks. (job_id, received_ms) turns it into one seek.

Frozen like every revision: it names its index itself.
"""
from typing import Sequence, Union

from alembic import op

revision: str = "0010"
down_revision: Union[str, Sequence[str], None] = "0009"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_index("ix_job_reports_job_id_received_ms", "job_reports", ["job_id", "received_ms"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_reports_job_id_received_ms", table_name="job_reports")
