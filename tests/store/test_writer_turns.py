"""Writers of one process take turns at SQLite's write lock on a lock of their own (issue 20): a writer that
finds another inside its transaction waits on that lock, not polling SQLite (whose busy handler sleeps up to
100 ms between tries and can lose every race for seconds), and goes the moment it is free."""

from __future__ import annotations

import threading

from sqlalchemy import event, text

from trimtab.store.engine import open_engine
from trimtab.store.transactions import sqlite_writer_turn, write_transaction


def test_a_second_writer_waits_its_turn_not_in_sqlites_busy_handler_and_then_writes(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path / 't.db'}")

    @event.listens_for(engine, "connect")
    def short_busy_timeout(dbapi_connection, _record):
        # SQLite's busy handler gives up after 100 ms here: a writer left to it fails while the first one holds on
        dbapi_connection.execute("PRAGMA busy_timeout=100")

    engine.dispose()  # (the connection open_engine made has the daemon's 5 s)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (who TEXT)"))
    inside, release, second_done = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def first():
        with write_transaction(engine) as conn:
            conn.execute(text("INSERT INTO t VALUES ('first')"))
            inside.set()
            release.wait(10)

    def second():
        try:
            with write_transaction(engine) as conn:
                conn.execute(text("INSERT INTO t VALUES ('second')"))
            second_done.set()
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    a = threading.Thread(target=first)
    a.start()
    assert inside.wait(10)
    b = threading.Thread(target=second)
    b.start()
    b.join(0.5)  # five busy timeouts
    assert b.is_alive() and not second_done.is_set() and errors == []
    release.set()
    a.join(10)
    assert second_done.wait(10) and errors == []
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT who FROM t"))] == ["first", "second"]
    engine.dispose()


def test_the_turn_is_reentrant_and_postgresql_has_none(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path / 't.db'}")
    with sqlite_writer_turn(engine), sqlite_writer_turn(engine):  # a writer that nests does not deadlock itself
        pass
    engine.dispose()
    from sqlalchemy import create_engine

    other = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected
    with sqlite_writer_turn(other):
        pass
