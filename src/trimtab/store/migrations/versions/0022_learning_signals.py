"""Step reports carry the step's learning signals (issue 41): reward, clip fraction, KL, effective sample size,
gradient norm, entropy and stale share, by trimtab's names (``learning_<name>``), so a change to a knob that changes
what is learned (staleness, sync frequency) can be judged on learning, not only on samples per second.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 05:40:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: Union[str, Sequence[str], None] = "0021"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

REPORT_COLUMNS = tuple(f"learning_{name}" for name in ("reward", "clip_fraction", "kl", "eff_sample_size", "grad_norm",
                                                        "entropy", "stale_share"))


def upgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in REPORT_COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_reports") as batch:
        for name in reversed(REPORT_COLUMNS):
            batch.drop_column(name)
