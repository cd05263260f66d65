"""BatchWriter: a batch lands in one transaction, a replay lands nowhere, bad floats become NULL."""

import math
import os

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from trimtab.contract.readings import Batch, GpuProcess, GpuSample, HealthEvent, NodeInfo, NvlinkSample
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate
from trimtab.store.models import (gpu_nvlink_samples, gpu_processes, gpu_samples, gpus, health_events, host_samples,
                                  nodes, rollup_state)
from tests.store.conftest import NODE, T0_MS, count, gpu_info, make_batch


def with_extras(batch: Batch) -> Batch:
    t = batch.gpu_samples[0].ts_ms
    batch.processes = [GpuProcess("GPU-0000", t, pid=4242, used_memory_bytes=2**30, name="python"),
                       GpuProcess("GPU-0001", t, pid=4243)]
    batch.events = [HealthEvent(t, "xid", "Xid 79: fallen off the bus", gpu_uuid="GPU-0001", xid=79),
                    HealthEvent(t, "source_error", "psutil failed")]  # node-wide: no GPU
    return batch


def test_a_batch_is_stored_with_its_node_gpus_and_values(engine):
    result = BatchWriter(engine).write(with_extras(make_batch([T0_MS, T0_MS + 1000], mem_used_bytes=7 * 2**30)))
    assert (result.gpu_samples_inserted, result.host_samples_inserted, result.processes_inserted,
            result.events_inserted, result.duplicates, result.total_inserted) == (4, 2, 2, 2, 0, 10)
    with engine.connect() as conn:
        node = conn.execute(select(nodes)).mappings().one()
        assert (node.hostname, node.simulated, node.driver_version) == ("node-a", False, "550.54")
        assert (node.first_seen_ms, node.last_seen_ms) == (T0_MS, T0_MS + 1000)
        assert conn.execute(select(gpus.c.uuid, gpus.c.gpu_index, gpus.c.pcie_peak_bytes_per_s)
                            .order_by(gpus.c.gpu_index)).all() == [("GPU-0000", 0, 63e9), ("GPU-0001", 1, 63e9)]
        rows = conn.execute(select(gpus.c.uuid, gpu_samples.c.ts_ms, gpu_samples.c.util_pct,
                                   gpu_samples.c.mem_used_bytes, gpu_samples.c.power_w)
                            .join(gpus).order_by(gpus.c.uuid, gpu_samples.c.ts_ms)).all()
    assert rows == [("GPU-0000", T0_MS, 0.0, 7 * 2**30, None), ("GPU-0000", T0_MS + 1000, 1.0, 7 * 2**30, None),
                    ("GPU-0001", T0_MS, 10.0, 7 * 2**30, None), ("GPU-0001", T0_MS + 1000, 11.0, 7 * 2**30, None)]


def test_replaying_a_batch_inserts_nothing_and_counts_duplicates(engine):
    batch = with_extras(make_batch([T0_MS, T0_MS + 1000, T0_MS + 2000]))
    first = BatchWriter(engine).write(batch)
    again = BatchWriter(engine).write(batch)  # a fresh writer, as after an agent restart replaying its spool
    assert first.total_inserted == 6 + 3 + 2 + 2
    assert again.total_inserted == 0 and again.gpu_samples_inserted == 0
    assert again.duplicates == first.total_inserted
    assert [count(engine, t) for t in (gpu_samples, host_samples, gpu_processes, health_events, nodes, gpus)] == \
           [6, 3, 2, 2, 1, 2]


def test_per_link_nvlink_is_stored_once_and_a_gpu_without_links_has_no_rows(engine):
    from trimtab.store.queries import latest_nvlink_samples

    batch = make_batch([T0_MS, T0_MS + 3000])
    batch.nvlink_samples = [NvlinkSample("GPU-0000", t, link, tx_bytes_per_s=1e9 * (link + 1) + t - T0_MS,
                                         rx_bytes_per_s=None if link == 1 else 2e9)
                            for t in (T0_MS, T0_MS + 3000) for link in range(3)]
    batch.nvlink_samples.append(NvlinkSample("GPU-0000", T0_MS + 3000, 3, tx_bytes_per_s=math.nan))
    first = BatchWriter(engine).write(batch)
    again = BatchWriter(engine).write(batch)
    assert (first.nvlink_samples_inserted, again.nvlink_samples_inserted) == (7, 0)
    assert first.total_inserted == 4 + 2 + 7 and again.duplicates == first.total_inserted
    latest = latest_nvlink_samples(engine)
    assert {row.gpu_uuid for row in latest} == {"GPU-0000"}  # GPU-0001 reported no links: nothing, not zeros
    assert [(r.ts_ms, r.link, r.metrics["tx_bytes_per_s"], r.metrics["rx_bytes_per_s"]) for r in latest] == [
        (T0_MS + 3000, 0, 1e9 + 3000, 2e9), (T0_MS + 3000, 1, 2e9 + 3000, None), (T0_MS + 3000, 2, 3e9 + 3000, 2e9),
        (T0_MS + 3000, 3, None, None)]  # NaN stored as NULL
    assert latest_nvlink_samples(engine, not_after_ms=T0_MS + 2999)[0].ts_ms == T0_MS
    assert count(engine, gpu_nvlink_samples) == 7


def test_a_partly_replayed_batch_stores_only_the_new_rows(engine):
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS, T0_MS + 1000]))
    result = writer.write(make_batch([T0_MS + 1000, T0_MS + 2000]))
    assert (result.gpu_samples_inserted, result.host_samples_inserted, result.duplicates) == (2, 1, 3)
    assert count(engine, gpu_samples) == 6


def test_nan_and_infinity_are_stored_as_null(engine):
    batch = make_batch([T0_MS], n_gpus=1, power_w=math.nan, temperature_c=math.inf, sm_clock_mhz=float("-inf"),
                       mem_used_bytes=float(2**30))
    batch.host_samples[0].load1 = math.nan
    BatchWriter(engine).write(batch)
    with engine.connect() as conn:
        row = conn.execute(select(gpu_samples.c.util_pct, gpu_samples.c.power_w, gpu_samples.c.temperature_c,
                                  gpu_samples.c.sm_clock_mhz, gpu_samples.c.mem_used_bytes)).one()
        load1 = conn.execute(select(host_samples.c.load1)).scalar_one()
    assert tuple(row) == (0.0, None, None, None, 2**30) and load1 is None


def test_a_sample_of_a_gpu_missing_from_the_inventory_is_kept_under_a_placeholder(engine):
    writer = BatchWriter(engine)
    batch = make_batch([T0_MS], n_gpus=1, inventory=False)
    batch.gpu_samples.append(GpuSample(gpu_uuid="GPU-LATE", ts_ms=T0_MS, util_pct=55.0))
    assert writer.write(batch).gpu_samples_inserted == 2
    with engine.connect() as conn:
        assert conn.execute(select(gpus.c.uuid, gpus.c.gpu_index, gpus.c.name).order_by(gpus.c.uuid)).all() == \
               [("GPU-0000", -1, "unknown"), ("GPU-LATE", -1, "unknown")]
    # The inventory arrives with the next batch and completes the row the samples already point to.
    writer.write(make_batch([T0_MS + 1000], n_gpus=1))
    with engine.connect() as conn:
        assert conn.execute(select(gpus.c.gpu_index, gpus.c.name).where(gpus.c.uuid == "GPU-0000")).one() == \
               (0, "NVIDIA H200")
        assert conn.execute(select(gpu_samples.c.ts_ms).join(gpus).where(gpus.c.uuid == "GPU-0000")
                            .order_by(gpu_samples.c.ts_ms)).scalars().all() == [T0_MS, T0_MS + 1000]


def test_a_changed_inventory_updates_the_gpu_row(engine):
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS], n_gpus=1))
    changed = make_batch([T0_MS + 1000], n_gpus=1)
    changed.gpus = [gpu_info(0, nvlink_link_count=18)]
    writer.write(changed)
    with engine.connect() as conn:
        assert conn.execute(select(gpus.c.nvlink_link_count)).scalar_one() == 18


def test_last_seen_follows_the_samples_and_the_node_facts_follow_the_newest_batch(engine):
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS]))
    writer.write(make_batch([T0_MS + 60_000]))
    sim = NodeInfo(hostname="node-a", simulated=True, scenario="imbalanced")
    writer.write(make_batch([T0_MS + 61_000], node=sim))
    with engine.connect() as conn:
        node = conn.execute(select(nodes)).mappings().one()
    assert (node.first_seen_ms, node.last_seen_ms, node.simulated, node.scenario) == \
           (T0_MS, T0_MS + 61_000, True, "imbalanced")


def test_late_samples_lower_the_rollup_mark_and_newer_ones_do_not(engine):
    writer = BatchWriter(engine)

    def dirty():
        with engine.connect() as conn:
            return conn.execute(select(rollup_state.c.dirty_from_ms)).scalar_one()

    writer.write(make_batch([T0_MS + 600_000]))
    assert dirty() == T0_MS + 600_000
    writer.write(make_batch([T0_MS + 700_000]))
    assert dirty() == T0_MS + 600_000
    writer.write(make_batch([T0_MS + 5_000, T0_MS + 800_000]))
    assert dirty() == T0_MS + 5_000


def test_a_node_wide_event_replayed_is_not_duplicated(engine):
    event = HealthEvent(T0_MS, "spool_dropped", "dropped 3 batches")
    BatchWriter(engine).write(Batch(node=NODE, events=[event]))
    assert BatchWriter(engine).write(Batch(node=NODE, events=[event])).events_inserted == 0
    BatchWriter(engine).write(Batch(node=NODE, events=[HealthEvent(T0_MS, "spool_dropped", "dropped 4 batches")]))
    with engine.connect() as conn:
        assert conn.execute(select(health_events.c.gpu_uuid, health_events.c.gpu_id, health_events.c.detail)
                            .order_by(health_events.c.detail)).all() == \
               [("", None, "dropped 3 batches"), ("", None, "dropped 4 batches")]


def test_a_refused_batch_leaves_nothing_behind_and_the_writer_goes_on(engine):
    writer = BatchWriter(engine)
    bad = make_batch([T0_MS])
    bad.events = [HealthEvent(T0_MS, None, "no kind")]  # kind is NOT NULL
    with pytest.raises(DBAPIError):
        writer.write(bad)
    assert [count(engine, t) for t in (nodes, gpus, gpu_samples, host_samples)] == [0, 0, 0, 0]
    assert writer.write(make_batch([T0_MS])).total_inserted == 3
    assert count(engine, gpu_samples) == 2


@pytest.mark.postgres
def test_a_store_connection_cut_mid_run_is_reported_as_unavailable_and_replaced(pg_url):
    app = f"trimtab_t_cut_{os.getpid()}"
    engine = open_engine(f"{pg_url}&application_name={app}")
    migrate(engine)
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS]))
    admin = open_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :app"),
                     {"app": app})
    with pytest.raises(OperationalError) as err:  # what the agent's sink turns into "spool and retry"
        writer.write(make_batch([T0_MS + 1000]))
    assert err.value.connection_invalidated
    assert writer.write(make_batch([T0_MS + 1000])).gpu_samples_inserted == 2
    assert count(engine, gpu_samples) == 4
    admin.dispose()
    engine.dispose()


def test_process_activity_round_trips_with_unknown_kept_null(engine):
    """The simulated node's process rows, their per-process activity included, come back as written: the baseline's
    unknown activity as NULL (never 0), the later intervals' means, sample counts and bounds exactly."""
    from trimtab.agent.simulated import PROCESS_EVERY_TICKS, SimulatedNode

    node = SimulatedNode(4, hostname="sim-a")
    readings = [node.sample(T0_MS + 1_000 * t) for t in range(2 * PROCESS_EVERY_TICKS + 1)]
    batch = Batch(node=NodeInfo(hostname="sim-a", simulated=True), gpus=node.inventory().gpus,
                  gpu_samples=[s for r in readings for s in r.gpu_samples],
                  processes=[p for r in readings for p in r.processes])
    assert BatchWriter(engine).write(batch).processes_inserted == len(batch.processes) == 3 * 6
    fields = ("ts_ms", "pid", "used_memory_bytes", "name", "sm_util_pct", "mem_util_pct", "util_samples",
              "util_from_ms", "util_to_ms")
    with engine.connect() as conn:
        stored = conn.execute(select(gpus.c.uuid, *(gpu_processes.c[f] for f in fields)).join(gpus)
                              .order_by(gpu_processes.c.ts_ms, gpu_processes.c.pid)).all()
    expected = sorted((p.gpu_uuid, *(getattr(p, f) for f in fields)) for p in batch.processes)
    assert [tuple(row) for row in stored] == sorted(expected, key=lambda row: (row[1], row[2]))
    baseline = [row for row in stored if row.ts_ms == T0_MS]
    assert baseline and all(row.sm_util_pct is None and row.util_samples is None for row in baseline)
    assert all(row.sm_util_pct is not None and row.util_to_ms == row.ts_ms for row in stored if row.ts_ms > T0_MS)
