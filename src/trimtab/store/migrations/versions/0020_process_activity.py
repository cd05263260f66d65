"""Per-process GPU activity beside the process rows (issue 40, item 1): the mean SM % and memory % of NVML's
per-process utilization samples over the interval (util_from_ms, util_to_ms], with their count; NULL where the GPU
cannot tell (never 0 for unknown).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 02:30:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: Union[str, Sequence[str], None] = "0019"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

PROCESS_COLUMNS = (("sm_util_pct", sa.Double()), ("mem_util_pct", sa.Double()), ("util_samples", sa.Integer()),
                   ("util_from_ms", sa.BigInteger()), ("util_to_ms", sa.BigInteger()))


def upgrade() -> None:
    with op.batch_alter_table("gpu_processes") as batch:
        for name, kind in PROCESS_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_processes") as batch:
        for name, _ in reversed(PROCESS_COLUMNS):
            batch.drop_column(name)
