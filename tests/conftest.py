"""Fixtures shared across test folders: the real PostgreSQL schema-per-test fixture lives with the store tests."""

from tests.store.conftest import pg_url  # noqa: F401  (re-exported fixture)
