"""``INSERT … ON CONFLICT`` in the dialect's own flavour (SQLite or PostgreSQL), and the ignoring insert of every
report and ack, built once per dialect and table.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from trimtab.store.errors import StoreError


def insert_for(dialect: Dialect, table: Table):
    """``INSERT`` in the dialect's own flavour, which has ``on_conflict_do_nothing/do_update`` and ``excluded``."""
    if dialect.name == "postgresql":
        return postgresql.insert(table)
    if dialect.name == "sqlite":
        return sqlite.insert(table)
    raise StoreError(f"unsupported database dialect {dialect.name!r}")


_IGNORING: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def insert_ignoring(dialect: Dialect, table: Table, *returning: str):
    """``INSERT … ON CONFLICT DO NOTHING [RETURNING …]`` into ``table``, built once per dialect and executed with
    the row as parameters. For the inserts of every report and ack: building the statement with ``.values(row)``
    per call cost SQLAlchemy more than the insert (issue 20, report latency)."""
    key = (dialect.name, table.name, returning)
    stmt = _IGNORING.get(key)
    if stmt is None:
        stmt = insert_for(dialect, table).on_conflict_do_nothing()
        if returning:
            stmt = stmt.returning(*(table.c[name] for name in returning))
        stmt = _IGNORING[key] = stmt
    return stmt
