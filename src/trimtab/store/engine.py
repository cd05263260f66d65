"""Opens the store (SQLite by default, PostgreSQL for a shared head) from its URL, checked by connecting once;
components of one process that use the same store share one engine (:func:`shared_engine`): one pool, one set of
pragmas.

What each backend needs at the connection level is set here (PostgreSQL's pool and libpq timeouts) or in
:mod:`trimtab.store.sqlite_pragmas` (SQLite's pragmas); the schema is brought up by :mod:`trimtab.store.migrate`.
"""

from __future__ import annotations

import re
import threading

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from trimtab.store.errors import StoreError, mask_url, store_error
from trimtab.store.sqlite_pragmas import sqlite_engine
from trimtab.store.sqlite_wal import checkpoint_wal

# libpq settings unless the URL sets them: a server that vanishes without a reset (host down, network cut) is
# noticed within about a minute, not after the kernel's two hours, so the agent spools instead of hanging.
PG_CONNECT_DEFAULTS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                       "keepalives_count": 3, "tcp_user_timeout": 60_000}
POSTGRES_DRIVER = "postgresql+psycopg"  # the driver trimtab installs (psycopg 3)


def resolve_url(url: str) -> str:
    """``postgres://`` and ``postgresql://`` (no driver named: SQLAlchemy would look for psycopg2, which trimtab
    does not install) mean PostgreSQL through psycopg 3; every other URL is returned as given."""
    return re.sub(r"^(postgres|postgresql)://", POSTGRES_DRIVER + "://", str(url), count=1)


def open_engine(url: str) -> Engine:
    """An engine for ``url``, checked by connecting once, so a wrong URL or a server that is down is reported
    here, as a :class:`StoreError`, rather than on the first write.

    SQLite (the default store of one node) gets its pragmas on every connection
    (:func:`trimtab.store.sqlite_pragmas.sqlite_engine`: WAL, a WAL bounded by the free disk, bounded page caches)
    and an explicit ``BEGIN`` (:func:`trimtab.store.transactions.write_transaction`).
    PostgreSQL gets ``pool_pre_ping`` so a connection dropped by a server restart is replaced, not reused, and
    the timeouts of :data:`PG_CONNECT_DEFAULTS` where the URL does not set its own.
    """
    url = resolve_url(url)
    masked = mask_url(url)
    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            engine = sqlite_engine(parsed)
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
        raise store_error(f"cannot open the store {masked}", exc) from exc
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
