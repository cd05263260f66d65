"""Keeps: SQLAlchemy tables, engine set-up, migrations, batched ingest, rollups, retention and queries."""

from trimtab.store.changes import StoredChange
from trimtab.store.decisions import StoredDecision
from trimtab.store.engine import open_engine, shared_engine
from trimtab.store.errors import StoreError, mask_url
from trimtab.store.ingest import BatchWriter
from trimtab.store.jobs import StoredJob
from trimtab.store.migrate import migrate
from trimtab.store.sink import StoreSink
from trimtab.store.tokens import StoredToken
from trimtab.store.transactions import write_transaction

__all__ = ["BatchWriter", "StoreError", "StoreSink", "StoredChange", "StoredDecision", "StoredJob", "StoredToken",
           "mask_url", "migrate", "open_engine", "shared_engine", "write_transaction"]
