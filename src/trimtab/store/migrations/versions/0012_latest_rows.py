"""The newest reading of each GPU and of each NVLink link in tables of their own, kept current by ingest (issue 39):
latest-sample reads cost one row a GPU instead of a search through every stored sample. Filled here from the
samples already stored (one pass over each table's primary key).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 23:30:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: Union[str, Sequence[str], None] = "0011"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

GPU_COLUMNS = (
    ("util_pct", sa.Double), ("sm_active_pct", sa.Double), ("sm_occupancy_pct", sa.Double),
    ("tensor_active_pct", sa.Double), ("dram_bw_util_pct", sa.Double), ("mem_used_bytes", sa.BigInteger),
    ("mem_reserved_bytes", sa.BigInteger), ("mem_total_bytes", sa.BigInteger), ("pcie_tx_bytes_per_s", sa.Double),
    ("pcie_rx_bytes_per_s", sa.Double), ("nvlink_tx_bytes_per_s", sa.Double), ("nvlink_rx_bytes_per_s", sa.Double),
    ("power_w", sa.Double), ("temperature_c", sa.Double), ("sm_clock_mhz", sa.BigInteger),
    ("clock_event_mask", sa.BigInteger),
)
LINK_COLUMNS = (("tx_bytes_per_s", sa.Double), ("rx_bytes_per_s", sa.Double))


def _fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f(f"fk_{table}_gpu_id_gpus"), ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "gpu_latest",
        sa.Column("gpu_id", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        *(sa.Column(name, kind(), nullable=True) for name, kind in GPU_COLUMNS),
        _fk("gpu_latest"),
        sa.PrimaryKeyConstraint("gpu_id", name=op.f("pk_gpu_latest")),
    )
    op.create_table(
        "gpu_nvlink_latest",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("link", sa.Integer(), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        *(sa.Column(name, kind(), nullable=True) for name, kind in LINK_COLUMNS),
        _fk("gpu_nvlink_latest"),
        sa.PrimaryKeyConstraint("gpu_id", "link", name=op.f("pk_gpu_nvlink_latest")),
    )
    gpu = ", ".join(name for name, _ in GPU_COLUMNS)
    op.execute(f"INSERT INTO gpu_latest (gpu_id, ts_ms, {gpu}) SELECT s.gpu_id, s.ts_ms, {gpu} FROM gpu_samples s "
               "JOIN (SELECT gpu_id, MAX(ts_ms) AS newest FROM gpu_samples GROUP BY gpu_id) n "
               "ON s.gpu_id = n.gpu_id AND s.ts_ms = n.newest")
    link = ", ".join(name for name, _ in LINK_COLUMNS)
    op.execute(f"INSERT INTO gpu_nvlink_latest (gpu_id, link, ts_ms, {link}) SELECT s.gpu_id, s.link, s.ts_ms, {link} "
               "FROM gpu_nvlink_samples s JOIN (SELECT gpu_id, link, MAX(ts_ms) AS newest FROM gpu_nvlink_samples "
               "GROUP BY gpu_id, link) n ON s.gpu_id = n.gpu_id AND s.link = n.link AND s.ts_ms = n.newest")


def downgrade() -> None:
    op.drop_table("gpu_nvlink_latest")
    op.drop_table("gpu_latest")
