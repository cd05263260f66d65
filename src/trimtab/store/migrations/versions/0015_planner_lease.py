"""The planner's lease: one row naming the server that plans, until when, and its term (epoch).

Several `trimtab server`s on one PostgreSQL serve ingest and reads together; exactly one plans. The one that holds
this row (``holder``, ``expires_ms`` in the database's clock) plans, renews it every second and writes each
decision in a transaction that first locks the row and checks its own ``epoch`` (control/leadership.py): a server
that lost the row — stopped, cut off, killed — cannot write one more decision once another took over.

Revision ID: 0015
Revises: 0011
Create Date: 2026-12-05 23:30:00

Frozen like every revision: it names its table and columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: Union[str, Sequence[str], None] = "0014"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "planner_lease",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("holder", sa.String(200), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("since_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_planner_lease")),
    )


def downgrade() -> None:
    op.drop_table("planner_lease")
