"""Where the agent's batches go: a store it opens itself (SQLite / PostgreSQL), or later a remote server.

A sink says "not now" by raising :class:`SinkUnavailable` (the writer then spools and retries); any other
exception means the batch itself was refused, and the writer keeps it aside instead of retrying forever.
"""

from __future__ import annotations

import logging
from typing import Optional, Protocol

from trimtab.agent.readings import Batch

log = logging.getLogger(__name__)


class SinkUnavailable(RuntimeError):
    """The destination cannot be reached right now; try again later."""


class Sink(Protocol):
    description: str

    def write(self, batch: Batch) -> int:
        """Write one batch; return the rows newly stored. Raise SinkUnavailable when the destination is down."""
        ...

    def maintenance(self, now_ms: int) -> None:
        """Periodic upkeep (rollups, retention) where the sink owns a store; may do nothing."""
        ...

    def close(self) -> None: ...


class StoreSink:
    """Writes straight into a store through SQLAlchemy. Connects lazily, so an agent can start while its
    PostgreSQL is still down and spool until it comes up."""

    def __init__(self, url: str, retention=None):
        from trimtab.store.engine import mask_url

        self.url = url
        self.description = f"store {mask_url(url)}"
        self._retention = retention
        self._engine = None
        self._writer = None

    def _connect(self):
        from sqlalchemy.exc import SQLAlchemyError

        from trimtab.store.engine import StoreError, migrate, open_engine
        from trimtab.store.ingest import BatchWriter

        if self._writer is None:
            try:
                engine = open_engine(self.url)
                migrate(engine)
            except (StoreError, SQLAlchemyError, OSError) as exc:
                raise SinkUnavailable(str(exc)) from exc
            self._engine, self._writer = engine, BatchWriter(engine)
        return self._writer

    def write(self, batch: Batch) -> int:
        from sqlalchemy.exc import DBAPIError, OperationalError

        writer = self._connect()
        dbapi = self._engine.dialect.loaded_dbapi
        try:
            result = writer.write(batch)
        except (OperationalError, dbapi.OperationalError, dbapi.InterfaceError) as exc:
            # The raw DB-API errors come from checking out a connection (server down, refused, reset).
            raise SinkUnavailable(_short(exc)) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise SinkUnavailable(_short(exc)) from exc
            raise
        return result.total_inserted

    def maintenance(self, now_ms: int) -> None:
        from trimtab.store.rollup import RetentionPolicy, run_maintenance

        if self._engine is None:
            return
        run_maintenance(self._engine, now_ms, self._retention or RetentionPolicy())

    @property
    def engine(self):
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return text[:limit]


def open_sink(db_url: Optional[str] = None, server_url: Optional[str] = None, token: Optional[str] = None) -> Sink:
    if server_url:
        raise NotImplementedError("shipping to a server arrives with `trimtab server`")
    assert db_url is not None
    return StoreSink(db_url)
