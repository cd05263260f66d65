"""Upkeep of a SQLite store's write-ahead log: the checkpoint at a clean stop (so the database file alone holds the
data), and the relief after a write met a full disk (the WAL may hold the space it needed).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from trimtab.store.errors import driver_words, mask_url

CHECKPOINT_BUSY_MS = 2000  # how long a stop waits for another process's reader to let the checkpoint finish


def checkpoint_wal(engine: Engine) -> bool:
    """Copy a SQLite store's WAL into the database file and truncate it (``wal_checkpoint(TRUNCATE)``), so that
    after a clean stop ``trimtab.db`` alone holds the data: a user who copies the file they see copies the store,
    not a 4 KiB header whose rows sit in ``trimtab.db-wal``. True when done (always on PostgreSQL: nothing to do);
    False, logged, when another process's reader kept it from finishing (its next checkpoint does it)."""
    if engine.dialect.name != "sqlite" or (engine.url.database or ":memory:") == ":memory:":
        return True
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"PRAGMA busy_timeout={CHECKPOINT_BUSY_MS}")
            busy, _, _ = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
    except SQLAlchemyError as exc:
        logging.getLogger(__name__).warning("WAL checkpoint of %s failed: %s", mask_url(engine.url), driver_words(exc))
        return False
    if busy:
        logging.getLogger(__name__).warning("WAL checkpoint of %s not finished: another process is reading it; the "
                                            "data stays in %s-wal until the next checkpoint",
                                            mask_url(engine.url), engine.url.database)
    return not busy


def is_disk_full(exc: BaseException) -> bool:
    """Whether a store error is SQLite's SQLITE_FULL (or an ENOSPC underneath it)."""
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "sqlite_errorcode", None) == 13 or "database or disk is full" in str(orig)


def relieve_full_disk(engine: Engine) -> str:
    """After SQLITE_FULL: try to checkpoint and truncate the WAL (it may hold the space the write needed), drop
    the pooled connections (new ones size their WAL from the space now free), and say why the write failed:
    the sentence names the store's directory, the bytes free there and the WAL's size."""
    database = engine.url.database or ""
    wal = Path(f"{database}-wal")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    except SQLAlchemyError:
        pass  # no room even for that; the next write, once space is freed, checkpoints on its own
    engine.dispose()
    try:
        st = os.statvfs(Path(database).parent)
        free = st.f_bavail * st.f_frsize
        wal_bytes = wal.stat().st_size if wal.exists() else 0
    except OSError:
        return f"the disk of the store {mask_url(engine.url)} is full"
    return (f"the disk of the store {mask_url(engine.url)} is full ({free} bytes free in {Path(database).parent}, "
            f"WAL {wal_bytes} bytes): writes wait until space is freed, then resume on their own")
