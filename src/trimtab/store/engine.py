"""Opens the store (SQLite by default, PostgreSQL for a shared head) and brings its schema to the latest migration.

Everything that differs between the two backends at the connection level lives here: SQLite's pragmas and
transaction control, PostgreSQL's pool settings, and the dialect's ``INSERT … ON CONFLICT`` construct. Components
of one process that use the same store share one engine (:func:`shared_engine`): one pool, one set of pragmas.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, ContextManager, Iterator

from sqlalchemy import Table, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Dialect, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

# Applied to every new SQLite connection (pragmas are per connection, except journal_mode which the file keeps).
SQLITE_PRAGMAS: tuple[tuple[str, object], ...] = (
    ("journal_mode", "WAL"),
    ("synchronous", "NORMAL"),
    ("busy_timeout", 5000),
    ("foreign_keys", "ON"),
    ("temp_store", "MEMORY"),
    ("cache_size", -65536),
)
# All the memory SQLite may keep in one process, its connections' page caches above all (a soft limit: past it SQLite
# recycles cached pages instead of taking more). Each connection may cache 64 MiB, and a server holds up to 15
# pooled connections plus its writers: without a total, the caches of connections that read a large store grow to
# ~1 GB between them (issue 39: the server's RSS still rose 7.6 MB/min after 15 minutes). ``TRIMTAB_SQLITE_MEMORY_MIB``
# sets it (0: no limit); read when an engine opens.
SQLITE_MEMORY_MIB_DEFAULT = 128
SQLITE_MEMORY_ENV = "TRIMTAB_SQLITE_MEMORY_MIB"
# The WAL's longest run between checkpoints, in pages: 10000 (~40 MiB) where the disk has room, less where it has not.
WAL_PAGES_MAX, WAL_PAGES_MIN = 10_000, 100
WAL_SHARE_OF_FREE = 8  # the WAL may take at most 1/8 of the free space at connect time
# libpq settings unless the URL sets them: a server that vanishes without a reset (host down, network cut) is
# noticed within about a minute, not after the kernel's two hours, so the agent spools instead of hanging.
PG_CONNECT_DEFAULTS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                       "keepalives_count": 3, "tcp_user_timeout": 60_000}
_IMMEDIATE = "trimtab_sqlite_immediate"
_MIGRATE_LOCK_KEY = 0x7472696D74616221  # any constant; PostgreSQL advisory lock that serialises migrate()


class StoreError(RuntimeError):
    """The store cannot be used: a malformed or unsupported URL, an unreachable server, a failed migration.
    The message names the URL (password masked) and what failed. ``permanent``: waiting will not help (a database
    or schema that does not exist, refused credentials, a URL trimtab cannot use); else it may be an outage."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


# Errors that no retry can cure, by SQLSTATE (class or code) and, for errors PostgreSQL sends while the connection
# is being made (libpq reports those without a SQLSTATE), by the server's words; each with what to do about it.
_PERMANENT_SQLSTATES = {"3D000": "the database does not exist", "3F000": "the schema does not exist",
                        "28000": "the server refused these credentials", "28P01": "the server refused these credentials",
                        "42501": "the user lacks a privilege trimtab needs"}
_PERMANENT_MESSAGES = (
    (re.compile(r'database "([^"]+)" does not exist'),
     "the database {0} does not exist: create it (createdb {0}) or fix the database name in the URL"),
    (re.compile(r"no schema has been selected to create in|schema \"?([^\" ]*)\"? does not exist"),
     "the schema selected by search_path does not exist: create it first (CREATE SCHEMA name;), or drop the "
     "URL's options=-csearch_path to use public"),
    (re.compile(r'role "([^"]+)" does not exist'), "the user {0} does not exist on that server: fix the URL's user"),
    (re.compile(r"password authentication failed|no pg_hba\.conf entry|authentication failed"),
     "the server refused these credentials: fix the URL's user/password (or the server's pg_hba.conf)"),
    (re.compile(r"permission denied"), "the user lacks a privilege trimtab needs (it creates and alters its tables): "
                                       "grant it, or use the owner of the database"),
    # SQLite's SQLITE_NOTADB and SQLITE_CORRUPT: the file is damaged (truncated, overwritten), not busy or away.
    (re.compile(r"file is not a database|database disk image is malformed"),
     "the file is damaged, not a SQLite database trimtab can use; it is left as it is: restore it from a copy, or "
     "move it aside and trimtab starts a new store"),
)
POSTGRES_DRIVER = "postgresql+psycopg"  # the driver trimtab installs (psycopg 3)


def resolve_url(url: str) -> str:
    """``postgres://`` and ``postgresql://`` (no driver named: SQLAlchemy would look for psycopg2, which trimtab
    does not install) mean PostgreSQL through psycopg 3; every other URL is returned as given."""
    return re.sub(r"^(postgres|postgresql)://", POSTGRES_DRIVER + "://", str(url), count=1)


def permanent_reason(exc: BaseException) -> str | None:
    """Why a store error will not go away by waiting, with what to do; None when it may be an outage."""
    orig = getattr(exc, "orig", None) or exc
    words = " ".join(str(orig).split())
    for pattern, advice in _PERMANENT_MESSAGES:
        found = pattern.search(words)
        if found:
            return advice.format(*(g or "" for g in found.groups()))
    return _PERMANENT_SQLSTATES.get(getattr(orig, "sqlstate", None) or "")


def mask_url(url: str | URL) -> str:
    """The URL as it can be logged: the password replaced by ``***`` (also for text that does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def open_engine(url: str) -> Engine:
    """An engine for ``url``, checked by connecting once, so a wrong URL or a server that is down is reported
    here, as a :class:`StoreError`, rather than on the first write.

    SQLite (the default store of one node) gets, on every connection:

    * ``journal_mode=WAL`` — readers (API, ``trimtab check``) never block the agent's writes, nor it them.
    * ``synchronous=NORMAL`` — in WAL mode a commit no longer waits for fsync; a power cut can lose the last
      commits but never corrupts the file. Telemetry can afford a few lost seconds, not a sync per batch.
    * ``busy_timeout=5000`` — agent, rollups and API may be separate processes: wait for the write lock.
    * ``foreign_keys=ON`` — SQLite ignores foreign keys unless asked.
    * ``temp_store=MEMORY`` and ``cache_size=-65536`` (64 MiB) — the rollups' GROUP BY and the window queries
      sort and scan in memory instead of in temporary files and repeated page reads; ``soft_heap_limit`` bounds
      all connections of the process together (:data:`SQLITE_MEMORY_MIB_DEFAULT`, ``$TRIMTAB_SQLITE_MEMORY_MIB``).
    * ``wal_autocheckpoint`` up to 10000 pages (~40 MiB of 4 KiB pages, default 1000) — a time series rewrites
      the same right-hand b-tree pages on every commit; a longer WAL absorbs many versions of a page before a
      checkpoint copies it once, so checkpoints are ten times rarer at the price of a WAL file of tens of MiB.
      On a small disk that WAL is the trap: it can fill the disk before the first checkpoint, and a checkpoint
      then needs space the WAL took, so the store stays full even after other files are deleted. Each
      connection therefore caps the WAL at 1/8 of the free space it finds (at least 100 pages), and
      ``journal_size_limit`` truncates the file back to that size after a checkpoint. A write that still meets
      a full disk: see :func:`relieve_full_disk`.

    Transactions on SQLite begin with an explicit ``BEGIN`` (see :func:`write_transaction`) instead of the
    sqlite3 module's implicit one, so reads inside a transaction are consistent and DDL is transactional.
    PostgreSQL gets ``pool_pre_ping`` so a connection dropped by a server restart is replaced, not reused, and
    the timeouts of :data:`PG_CONNECT_DEFAULTS` where the URL does not set its own.
    """
    url = resolve_url(url)
    masked = mask_url(url)
    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            engine = _sqlite_engine(parsed)
        elif backend == "postgresql":
            connect_args = {k: v for k, v in PG_CONNECT_DEFAULTS.items() if k not in parsed.query}
            engine = create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
        else:
            raise StoreError(f"unsupported store {masked}: trimtab stores to sqlite:/// or postgresql:// URLs",
                             permanent=True)
    except ArgumentError as exc:
        raise StoreError(f"not a database URL: {masked!r} ({exc})", permanent=True) from exc
    except NoSuchModuleError as exc:
        raise StoreError(f"no driver for {masked}: {exc}", permanent=True) from exc
    except OSError as exc:
        raise StoreError(f"cannot create the directory of the store {masked}: {exc}") from exc
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        engine.dispose()
        raise _store_error(f"cannot open the store {masked}", exc) from exc
    return engine


# url → [engine, users]: the engines shared_engine() has handed out and not yet seen released by every user.
_shared: dict[str, list] = {}
_shared_lock = threading.Lock()


def shared_engine(url: str) -> Engine:
    """This process's one engine for ``url``, opened (and checked, as :func:`open_engine`) on first use. Each call
    is paired with :func:`release_engine`; the engine is disposed when its last user releases it. (`trimtab up`'s
    API, rebalancer and agent all write one store: one engine, one pool.)"""
    key = resolve_url(url)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            entry = _shared[key] = [open_engine(key), 0]
        entry[1] += 1
        return entry[0]


def release_engine(engine: Engine) -> None:
    """One user of a :func:`shared_engine` is done with it; the last one checkpoints the WAL of a SQLite store
    (:func:`checkpoint_wal`) and disposes it. An engine that was not shared is disposed at once."""
    with _shared_lock:
        for key, entry in list(_shared.items()):
            if entry[0] is engine:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _shared[key]
                break
    checkpoint_wal(engine)
    engine.dispose()


CHECKPOINT_BUSY_MS = 2000  # how long a stop waits for another process's reader to let the checkpoint finish


def checkpoint_wal(engine: Engine) -> bool:
    """Copy a SQLite store's WAL into the database file and truncate it (``wal_checkpoint(TRUNCATE)``), so that
    after a clean stop ``trimtab.db`` alone holds the data: a user who copies the file they see copies the store,
    not a 4 KiB header whose rows sit in ``trimtab.db-wal``. True when done (always on PostgreSQL: nothing to do);
    False, logged, when another process's reader kept it from finishing (its next checkpoint does it)."""
    import logging

    if engine.dialect.name != "sqlite" or (engine.url.database or ":memory:") == ":memory:":
        return True
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"PRAGMA busy_timeout={CHECKPOINT_BUSY_MS}")
            busy, _, _ = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
    except SQLAlchemyError as exc:
        logging.getLogger(__name__).warning("WAL checkpoint of %s failed: %s", mask_url(engine.url), _reason(exc))
        return False
    if busy:
        logging.getLogger(__name__).warning("WAL checkpoint of %s not finished: another process is reading it; the "
                                            "data stays in %s-wal until the next checkpoint",
                                            mask_url(engine.url), engine.url.database)
    return not busy


def wal_pages_for(database: str, page_bytes: int) -> int:
    """How long the WAL may grow between checkpoints: 1/8 of the free space on the store's disk, in pages,
    within [WAL_PAGES_MIN, WAL_PAGES_MAX] (the maximum for an in-memory or unresolvable store)."""
    try:
        st = os.statvfs(Path(database).parent if database and database != ":memory:" else ".")
    except OSError:
        return WAL_PAGES_MAX
    share = st.f_bavail * st.f_frsize // WAL_SHARE_OF_FREE // page_bytes
    return max(WAL_PAGES_MIN, min(WAL_PAGES_MAX, share))


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


def _create_private(path: Path) -> None:
    """A new store's directory 0700 and file 0600 before SQLite writes a byte (its -wal and -shm files take the
    file's mode); an existing file keeps its mode."""
    from trimtab.paths import private_dir

    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.fchmod(fd, 0o600)
    os.close(fd)


def sqlite_memory_limit_bytes() -> int:
    """The process-wide limit on SQLite's memory: ``$TRIMTAB_SQLITE_MEMORY_MIB`` or the default, in bytes (0: none).
    A value that is not a whole number of MiB ≥ 0 is a :class:`StoreError` naming it."""
    raw = os.environ.get(SQLITE_MEMORY_ENV, "").strip()
    try:
        mib = int(raw) if raw else SQLITE_MEMORY_MIB_DEFAULT
    except ValueError:
        mib = -1
    if mib < 0:
        raise StoreError(f"{SQLITE_MEMORY_ENV}={raw!r}: give SQLite's memory limit as whole MiB (0: no limit)",
                         permanent=True)
    return mib * 2**20


def sqlite_memory_used_bytes() -> int | None:
    """What SQLite holds in this process now (``sqlite3_memory_used`` of the library the sqlite3 module loaded:
    memory outside Python's allocator, which tracemalloc never sees); None where it cannot be asked."""
    import ctypes

    import _sqlite3

    try:
        used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    used.restype = ctypes.c_int64
    return int(used())


def _sqlite_engine(url: URL) -> Engine:
    memory_limit = sqlite_memory_limit_bytes()
    database = url.database or ""
    if database and database != ":memory:" and not url.query.get("uri"):
        path = Path(database).expanduser()
        _create_private(path)
        url = url.set(database=str(path))
        database = str(path)
    engine = create_engine(url)
    _WRITER_TURNS[engine] = threading.RLock()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy, not the sqlite3 module, emits BEGIN (below)
        cursor = dbapi_connection.cursor()
        for name, value in SQLITE_PRAGMAS:
            cursor.execute(f"PRAGMA {name}={value}")
        page_bytes = cursor.execute("PRAGMA page_size").fetchone()[0]
        wal_pages = wal_pages_for(database, page_bytes)
        cursor.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
        cursor.execute(f"PRAGMA journal_size_limit={wal_pages * page_bytes}")
        cursor.execute(f"PRAGMA soft_heap_limit={memory_limit}")  # process-wide: the last engine opened sets it
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_IMMEDIATE) else "BEGIN")

    return engine


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


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the store's schema to ``revision`` with Alembic, on this engine's own connection.

    The scripts are found inside the installed package (``trimtab.store:migrations``), so no alembic.ini is
    needed at run time; the schema is whatever the connection selects (a PostgreSQL URL with
    ``options=-csearch_path=<schema>`` migrates that schema). The upgrade runs in one transaction, under a
    lock (SQLite: the write lock; PostgreSQL: an advisory lock), so two processes starting together cannot
    both run it.
    """
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", "trimtab.store:migrations")
    try:
        with write_transaction(engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATE_LOCK_KEY})
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    except (SQLAlchemyError, CommandError) as exc:
        raise _store_error(f"cannot migrate the store {mask_url(engine.url)}", exc,
                           permanent=isinstance(exc, CommandError)) from exc


def has_schema(engine: Engine) -> bool:
    """Whether trimtab's tables exist where this engine looks (readers do not migrate: an empty database or
    schema has none until an agent, `up` or `server` has run on it once)."""
    from sqlalchemy import inspect

    return inspect(engine).has_table("alembic_version")


def _store_error(what: str, exc: BaseException, permanent: bool = False) -> StoreError:
    """``what: <the driver's words>``; for an error waiting cannot cure, what to do about it instead of the SQL."""
    advice = permanent_reason(exc)
    if advice is None:
        return StoreError(f"{what}: {_reason(exc)}", permanent=permanent)
    return StoreError(f"{what}: {advice} ({_reason(exc).split(' LINE ')[0]})", permanent=True)


def _reason(exc: BaseException) -> str:
    """The driver's own words, on one line, without SQLAlchemy's statement dump and background link."""
    orig = getattr(exc, "orig", None)
    return " ".join(str(orig if orig is not None else exc).split()) or type(exc).__name__
