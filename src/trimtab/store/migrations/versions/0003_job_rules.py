"""Per-job rule overrides: a job may declare its own thresholds, windows or actions at registration.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 18:50:00

Frozen like every revision: it names its column itself. ``batch_alter_table`` so SQLite (no ALTER ADD with
constraints in general) and PostgreSQL take the same path.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("rules", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("rules")
