"""Opening a store and migrating it: the schema Alembic builds is exactly the models' schema, on both backends."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from trimtab.store.engine import open_engine
from trimtab.store.errors import StoreError
from trimtab.store.migrate import migrate
from trimtab.store.models import metadata
from trimtab.store.sqlite_pragmas import WAL_PAGES_MAX, WAL_PAGES_MIN, wal_pages_for
from tests.store.conftest import T0_MS, make_batch


def test_migrate_builds_the_models_schema_with_no_diff(engine):
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0022"
        assert conn.execute(text("SELECT id, dirty_from_ms FROM rollup_state")).all() == [(1, None)]


def test_migrate_again_is_a_no_op(engine):
    migrate(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM rollup_state")).scalar_one() == 1
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_postgresql_schema_comes_from_the_url_search_path(pg_url):
    engine = open_engine(pg_url)
    migrate(engine)
    schema = pg_url.rsplit("%3D", 1)[1]
    with engine.connect() as conn:
        tables = set(conn.execute(text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                                  {"s": schema}).scalars())
    engine.dispose()
    assert {"nodes", "gpus", "gpu_samples", "gpu_rollup_1m", "alembic_version"} <= tables


def test_sqlite_store_gets_its_directory_and_pragmas(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path}/deep/er/t.db")
    assert (tmp_path / "deep" / "er" / "t.db").exists()
    with engine.connect() as conn:
        pragma = {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar() for name in
                  ("journal_mode", "synchronous", "busy_timeout", "foreign_keys", "temp_store", "wal_autocheckpoint")}
    engine.dispose()
    assert pragma == {"journal_mode": "wal", "synchronous": 1, "busy_timeout": 5000, "foreign_keys": 1,
                      "temp_store": 2, "wal_autocheckpoint": wal_pages_for(str(tmp_path / "deep/er/t.db"), 4096)}


def test_the_wal_is_sized_by_the_free_space_of_the_stores_disk(small_disk):
    disk = small_disk(8 * 1024 * 1024)
    engine = open_engine(f"sqlite:///{disk}/t.db")
    with engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
        limit = conn.exec_driver_sql("PRAGMA journal_size_limit").scalar()
    engine.dispose()
    assert WAL_PAGES_MIN <= pages <= 8 * 1024 * 1024 // 8 // 4096, "at most 1/8 of the free space"
    assert limit == pages * 4096
    assert wal_pages_for("/", 4096) <= WAL_PAGES_MAX


@pytest.mark.parametrize("url, words", [
    ("not a url", "not a database URL"),
    ("mysql://u:pw@localhost/x", "unsupported store"),
    ("postgresql+psycopg://trimtab:s3cret@127.0.0.1:1/test", "cannot open the store"),
])
def test_bad_or_unreachable_urls_raise_store_error_with_the_password_masked(url, words):
    with pytest.raises(StoreError) as err:
        open_engine(url)
    assert words in str(err.value)
    assert "s3cret" not in str(err.value) and "pw@" not in str(err.value)


def test_unreachable_error_names_the_url_and_the_failure():
    with pytest.raises(StoreError, match=r"trimtab:\*\*\*@127\.0\.0\.1:1/test.*(refused|failed)"):
        open_engine("postgresql+psycopg://trimtab:s3cret@127.0.0.1:1/test")


def test_one_engine_per_url_per_process_until_its_last_user_lets_go(tmp_path):
    from trimtab.store.engine import release_engine, shared_engine
    from trimtab.store.sink import StoreSink

    url = f"sqlite:///{tmp_path}/shared.db"
    api_engine = shared_engine(url)
    migrate(api_engine)
    sink = StoreSink(url)
    sink.write(make_batch([T0_MS]))
    assert sink.engine is api_engine  # `up`'s agent writes through the API's engine: one pool, one set of pragmas
    assert shared_engine(f"sqlite:///{tmp_path}/other.db") is not api_engine
    sink.close()
    with api_engine.connect() as conn:  # the API still holds it
        assert conn.execute(text("SELECT count(*) FROM gpu_samples")).scalar_one() == 2
    assert shared_engine(url) is api_engine
    release_engine(api_engine)
    release_engine(api_engine)  # the last user: disposed and forgotten
    again = shared_engine(url)
    assert again is not api_engine
    release_engine(again)
