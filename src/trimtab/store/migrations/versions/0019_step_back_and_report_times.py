"""Clocks that step back, and step reports that keep their own time (issue 39, item 4).

* ``gpu_latest.receiver_ms`` / ``gpu_nvlink_latest.receiver_ms``: the latest reading's time on the receiver's clock
  (its ``ts_ms`` + the node's skew as its batch came). After a node's clock steps back its new readings are older
  by ``ts_ms`` than the held row, which kept them out until real time caught up with the step (an hour's step: an
  hour of a frozen reading); they now replace it once their receiver time is clearly newer. NULL for rows written
  before, and for batches that do not say when they were sent: those follow ``ts_ms`` alone, as before.
* ``job_reports.ended_ms``: when the step ended by the rank's wall clock (the hook stamps it). A report spooled
  through a head outage was filed at its arrival (``received_ms``), so ten minutes of steps landed at one instant
  and the windows over them read GPU samples of the wrong minutes. NULL for reports without it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 02:30:00

Frozen like every revision: it names its columns itself.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: Union[str, Sequence[str], None] = "0018"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

ADDED = (("gpu_latest", "receiver_ms"), ("gpu_nvlink_latest", "receiver_ms"), ("job_reports", "ended_ms"))


def upgrade() -> None:
    for table, column in ADDED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(column, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table, column in reversed(ADDED):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column)
