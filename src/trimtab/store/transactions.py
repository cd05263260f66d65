"""Write transactions: SQLite's ``BEGIN IMMEDIATE`` for a transaction that will write, and the turn at SQLite's
write lock that the writers of one process queue for.

SQLite has one writer at a time; taking the lock before the first read, and queueing for it inside the process,
keeps a read-then-write transaction from failing half-way and a steady stream of writers from starving one.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

_IMMEDIATE = "trimtab_sqlite_immediate"


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that will write; commits on success, rolls back on error.

    On SQLite it starts with ``BEGIN IMMEDIATE``: the write lock is taken (waiting up to busy_timeout) before
    the first read, so a transaction that reads and then writes can never fail half-way with SQLITE_BUSY
    because another writer committed in between. The writers of one process queue for it on
    :func:`sqlite_writer_turn` first.
    """
    # (the connection first: opening one runs the pragmas, which need no turn and must not hold one up)
    with engine.connect() as conn, sqlite_writer_turn(engine):
        if conn.dialect.name == "sqlite":
            conn.execution_options(**{_IMMEDIATE: True})
        with conn.begin():
            yield conn


# engine → the lock its writers in this process take before SQLite's write lock (SQLite engines only)
_WRITER_TURNS: "weakref.WeakKeyDictionary[Engine, threading.RLock]" = weakref.WeakKeyDictionary()


def sqlite_writer_turn(engine: Engine) -> ContextManager:
    """This process's turn at ``engine``'s SQLite write lock (nothing to wait for on PostgreSQL).

    SQLite has one writer at a time, and a writer that finds the lock taken polls for it: its busy handler
    sleeps 1, 2, 5 … then 100 ms between tries, never woken when the lock frees, so with a steady stream of
    writers (reports, acks, the rebalancer's decisions, the agent's batches) one can lose every race for
    seconds. Writers of one process instead queue on a lock here, which hands over the moment it is released;
    SQLite's own lock then only arbitrates between processes."""
    return _WRITER_TURNS.get(engine) or nullcontext()


def queue_sqlite_writers(engine: Engine) -> None:
    """Give a new SQLite engine its writers' turn (:func:`sqlite_writer_turn`) and its own ``BEGIN``: a plain one,
    or ``BEGIN IMMEDIATE`` in a :func:`write_transaction` (the sqlite3 module's implicit BEGIN is turned off on
    connect)."""
    _WRITER_TURNS[engine] = threading.RLock()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_IMMEDIATE) else "BEGIN")
