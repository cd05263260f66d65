"""Brings a store's schema to the latest migration (Alembic, run on the engine's own connection, under a lock),
and tells a reader whether a schema is there at all.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from trimtab.store.errors import mask_url, store_error
from trimtab.store.transactions import write_transaction

_MIGRATE_LOCK_KEY = 0x7472696D74616221  # any constant; PostgreSQL advisory lock that serialises migrate()


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
        raise store_error(f"cannot migrate the store {mask_url(engine.url)}", exc,
                           permanent=isinstance(exc, CommandError)) from exc


def has_schema(engine: Engine) -> bool:
    """Whether trimtab's tables exist where this engine looks (readers do not migrate: an empty database or
    schema has none until an agent, `up` or `server` has run on it once)."""
    from sqlalchemy import inspect

    return inspect(engine).has_table("alembic_version")
