"""What the store keeps in a process has sizes one can name (issue 39): SQLite's memory across all connections, and
what a BatchWriter remembers of the nodes and GPUs it filed."""

from __future__ import annotations

import pytest

from trimtab.contract.readings import NodeInfo
from trimtab.store import sqlite_pragmas
from trimtab.store.engine import open_engine
from trimtab.store.errors import StoreError
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate
from trimtab.store.sqlite_pragmas import sqlite_memory_used_bytes
from tests.store.conftest import T0_MS, count, make_batch

MIB = 2**20


@pytest.fixture
def restore_sqlite_limit():
    """The limit is process-wide: put the default back for the tests after."""
    yield
    engine = open_engine("sqlite://")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"PRAGMA soft_heap_limit={sqlite_pragmas.SQLITE_MEMORY_MIB_DEFAULT * MIB}")
    engine.dispose()


def test_sqlite_memory_of_all_connections_together_stays_under_its_limit(tmp_path, monkeypatch,
                                                                         restore_sqlite_limit):
    """Each connection may cache 64 MiB: four connections reading a 16 MB store held ~60 MB before."""
    if sqlite_memory_used_bytes() is None:
        pytest.skip("this Python's sqlite3 library does not export sqlite3_memory_used")
    monkeypatch.setenv("TRIMTAB_SQLITE_MEMORY_MIB", "4")
    engine = open_engine(f"sqlite:///{tmp_path}/big.db")
    migrate(engine)
    writer = BatchWriter(engine)
    for first in range(0, 30_000, 2000):
        writer.write(make_batch([T0_MS + 1000 * t for t in range(first, first + 2000)], n_gpus=8, power_w=300.0,
                                mem_used_bytes=2**30, temperature_c=60.0, sm_active_pct=50.0, pcie_tx_bytes_per_s=1e9))
    writer.close()
    connections = [engine.connect() for _ in range(4)]
    try:
        for conn in connections:  # each connection's schema (it grows with every table a migration adds)
            conn.exec_driver_sql("SELECT count(*) FROM gpu_samples WHERE gpu_id < 0").scalar()
        schema_used = sqlite_memory_used_bytes()
        for conn in connections:
            conn.exec_driver_sql("SELECT sum(util_pct), sum(power_w) FROM gpu_samples").scalar()
        used = sqlite_memory_used_bytes()
        store_bytes = connections[0].exec_driver_sql("PRAGMA page_count").scalar() * 4096
    finally:
        for conn in connections:
            conn.close()
        engine.dispose()
    assert store_bytes > 12 * MIB
    # reading the whole 12+ MB store through four connections adds at most the 4 MiB limit, over what their
    # schemas hold (before the limit it added ~60 MB: each connection cached 64 MiB)
    assert used - schema_used < 4 * MIB + MIB // 2, (used / MIB, schema_used / MIB)


@pytest.mark.parametrize("value", ["lots", "-1", "1.5"])
def test_a_bad_sqlite_memory_limit_is_an_error_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.setenv("TRIMTAB_SQLITE_MEMORY_MIB", value)
    with pytest.raises(StoreError, match="TRIMTAB_SQLITE_MEMORY_MIB"):
        open_engine(f"sqlite:///{tmp_path}/t.db")


def test_a_writer_remembers_at_most_its_bound_of_nodes_and_still_files_every_batch(store_engine):
    writer = BatchWriter(store_engine, max_remembered=5)
    for round_ in range(2):
        for i in range(12):  # host names that come and go
            node = NodeInfo(hostname=f"pod-{i}")
            writer.write(make_batch([T0_MS + 1000 * round_], n_gpus=2, node=node, uuid_prefix=f"GPU-{i}-"))
            assert len(writer._node_ids) <= 5 and len(writer._gpus) <= 5
    writer.close()
    from trimtab.store.models import gpu_latest, gpu_samples, gpus, nodes

    assert [count(store_engine, t) for t in (nodes, gpus, gpu_samples, gpu_latest)] == [12, 24, 48, 24]
