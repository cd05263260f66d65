"""Alembic environment of the store.

:func:`trimtab.store.migrate.migrate` hands over its own connection (``config.attributes["connection"]``), so
no alembic.ini is needed. A developer writing a new revision can instead run Alembic against a scratch store
named by ``TRIMTAB_STORE_URL`` (or ``sqlalchemy.url`` in an ini file of their own).
"""

import os

from alembic import context

from trimtab.store.models import metadata

config = context.config


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things: later revisions rebuild tables through batch mode there.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


_given = config.attributes.get("connection")
if _given is not None:
    _run(_given)
else:
    from trimtab.store.engine import open_engine

    _url = os.environ.get("TRIMTAB_STORE_URL") or config.get_main_option("sqlalchemy.url")
    if not _url:
        raise SystemExit("set TRIMTAB_STORE_URL (or sqlalchemy.url) to the store to run Alembic against")
    _engine = open_engine(_url)
    try:
        with _engine.begin() as _conn:
            _run(_conn)
    finally:
        _engine.dispose()
