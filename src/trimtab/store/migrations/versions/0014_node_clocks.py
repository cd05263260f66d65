"""Each node's clock as the store's writers saw it: when it was last heard from (by the receiver's clock, also when
its batches are refused), its skew against the receiver, and when a batch was last refused for being dated ahead —
so a node whose clock is off is shown with its skew, not absent (``store/clocks.py``).

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-05 23:30:00

Frozen like every revision: it names its table and columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: Union[str, Sequence[str], None] = "0012"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "node_clocks",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("heard_ms", sa.BigInteger(), nullable=False),
        sa.Column("clock_skew_ms", sa.BigInteger(), nullable=True),
        sa.Column("refused_ms", sa.BigInteger(), nullable=True),
        sa.Column("refused_detail", sa.String(length=512), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name="fk_node_clocks_node_id_nodes", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node_id", name="pk_node_clocks"),
    )


def downgrade() -> None:
    op.drop_table("node_clocks")
