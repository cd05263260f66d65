"""Where a job's roles run (role, node, local GPUs, worker pids), as the job found or declared them (issue 21).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 18:40:00

Frozen like every revision: it names its column itself. ``batch_alter_table`` so SQLite and PostgreSQL take the
same path.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: Union[str, Sequence[str], None] = "0008"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("roles", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("roles")
