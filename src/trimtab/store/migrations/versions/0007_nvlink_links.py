"""Per-link NVLink readings beside the per-GPU sums: one row per (GPU, time, link), only for links that reported
(issue 13).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-11 12:00:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: Union[str, Sequence[str], None] = "0006"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "gpu_nvlink_samples",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("link", sa.Integer(), nullable=False),
        sa.Column("tx_bytes_per_s", sa.Double(), nullable=True),
        sa.Column("rx_bytes_per_s", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_gpu_nvlink_samples_gpu_id_gpus"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("gpu_id", "ts_ms", "link", name=op.f("pk_gpu_nvlink_samples")),
        sqlite_with_rowid=False,
    )
    op.create_index(op.f("ix_gpu_nvlink_samples_ts_ms"), "gpu_nvlink_samples", ["ts_ms"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_gpu_nvlink_samples_ts_ms"), table_name="gpu_nvlink_samples")
    op.drop_table("gpu_nvlink_samples")
