"""The planner's lease row (migration 0015): taken, renewed, released and checked in SQL here; who holds it and
why it is a lease, not an advisory lock: control/leadership.py.

Time is the database's (PostgreSQL's ``clock_timestamp()``), so servers whose clocks disagree agree on expiry;
on SQLite it is this machine's, the only one that can open the file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Connection, Engine, select, text, update

from trimtab.store.inserts import insert_ignoring
from trimtab.store.models import planner_lease
from trimtab.store.transactions import write_transaction

PLANNER = "planner"  # the row's name


@dataclass(frozen=True)
class LeaseRow:
    holder: Optional[str]
    epoch: int
    expires_ms: int
    since_ms: Optional[int]


def db_now_ms(conn: Connection) -> int:
    """The database's clock, in epoch ms."""
    if conn.dialect.name == "postgresql":
        return int(conn.execute(text("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint")).scalar_one())
    return int(time.time() * 1000)


def read_lease(engine: Engine) -> tuple[Optional[LeaseRow], int]:
    """(the lease row as stored, None before any server took it; the database's time now)."""
    c = planner_lease.c
    with engine.connect() as conn:
        row = conn.execute(select(c.holder, c.epoch, c.expires_ms, c.since_ms).where(c.name == PLANNER)).first()
        now = db_now_ms(conn)
    return (None if row is None else LeaseRow(row.holder, int(row.epoch), int(row.expires_ms), row.since_ms)), now


def take_or_renew(engine: Engine, holder: str, epoch: Optional[int], lease_ms: int) -> tuple[Optional[int], Optional[str]]:
    """Renew ``holder``'s lease at ``epoch`` (None: take it if it expired) for ``lease_ms`` from now:
    (the epoch held after it, None if not held; the holder of a live lease that is not ours)."""
    c = planner_lease.c
    with write_transaction(engine) as conn:
        now = db_now_ms(conn)
        expires = now + lease_ms
        if epoch is not None:
            kept = conn.execute(update(planner_lease).where(c.name == PLANNER, c.holder == holder, c.epoch == epoch)
                                .values(expires_ms=expires)).rowcount
            return (epoch if kept else None), None
        conn.execute(insert_ignoring(conn.dialect, planner_lease),
                     {"name": PLANNER, "holder": None, "epoch": 0, "expires_ms": 0, "since_ms": None})
        # (two servers taking it at once on PostgreSQL: the second waits for the first's row lock, then finds the
        # lease live and updates nothing)
        taken = conn.execute(update(planner_lease).where(c.name == PLANNER, c.expires_ms < now).values(
            holder=holder, epoch=c.epoch + 1, expires_ms=expires, since_ms=now)).rowcount
        row = conn.execute(select(c.holder, c.epoch).where(c.name == PLANNER)).one()
        return (int(row.epoch), None) if taken else (None, row.holder)


def release(engine: Engine, holder: str, epoch: int) -> None:
    """Let the lease expire now, if ``holder`` still holds it at ``epoch``."""
    c = planner_lease.c
    with write_transaction(engine) as conn:
        conn.execute(update(planner_lease).where(c.name == PLANNER, c.holder == holder, c.epoch == epoch)
                     .values(expires_ms=0))


def holds(conn: Connection, holder: str, epoch: int) -> bool:
    """Inside a write transaction: lock the lease row (PostgreSQL: FOR UPDATE; SQLite's write lock is already
    held) and say whether ``holder`` holds it at ``epoch``. A takeover, an UPDATE of the row, waits for this
    transaction to end."""
    c = planner_lease.c
    return conn.execute(select(c.epoch).where(c.name == PLANNER, c.holder == holder, c.epoch == epoch)
                        .with_for_update()).first() is not None
