"""A SQLite engine as trimtab opens it: the new file private, and on every connection the pragmas that make
one file serve an agent's writes, the API's reads and the rollups at once (WAL, a WAL sized to the free disk,
page caches bounded for the whole process).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine

from trimtab.store.errors import StoreError
from trimtab.store.transactions import queue_sqlite_writers

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


def wal_pages_for(database: str, page_bytes: int) -> int:
    """How long the WAL may grow between checkpoints: 1/8 of the free space on the store's disk, in pages,
    within [WAL_PAGES_MIN, WAL_PAGES_MAX] (the maximum for an in-memory or unresolvable store)."""
    try:
        st = os.statvfs(Path(database).parent if database and database != ":memory:" else ".")
    except OSError:
        return WAL_PAGES_MAX
    share = st.f_bavail * st.f_frsize // WAL_SHARE_OF_FREE // page_bytes
    return max(WAL_PAGES_MIN, min(WAL_PAGES_MAX, share))


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


def sqlite_engine(url: URL) -> Engine:
    """An engine for a SQLite ``url`` (its file and directory created private), which sets on every connection:

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
      a full disk: see :func:`trimtab.store.sqlite_wal.relieve_full_disk`.

    Transactions begin with an explicit ``BEGIN`` (:func:`trimtab.store.transactions.write_transaction`) instead
    of the sqlite3 module's implicit one, so reads inside a transaction are consistent and DDL is transactional.
    """
    memory_limit = sqlite_memory_limit_bytes()
    database = url.database or ""
    if database and database != ":memory:" and not url.query.get("uri"):
        path = Path(database).expanduser()
        _create_private(path)
        url = url.set(database=str(path))
        database = str(path)
    engine = create_engine(url)
    queue_sqlite_writers(engine)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy, not the sqlite3 module, emits BEGIN (queue_sqlite_writers)
        cursor = dbapi_connection.cursor()
        for name, value in SQLITE_PRAGMAS:
            cursor.execute(f"PRAGMA {name}={value}")
        page_bytes = cursor.execute("PRAGMA page_size").fetchone()[0]
        wal_pages = wal_pages_for(database, page_bytes)
        cursor.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
        cursor.execute(f"PRAGMA journal_size_limit={wal_pages * page_bytes}")
        cursor.execute(f"PRAGMA soft_heap_limit={memory_limit}")  # process-wide: the last engine opened sets it
        cursor.close()

    return engine
