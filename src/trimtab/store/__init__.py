"""Keeps: SQLAlchemy tables, engine set-up, migrations, batched ingest, rollups, retention and queries."""
