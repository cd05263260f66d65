"""Rollups and retention: known values give known min/mean/max, late data is rolled up again, hours are the
sample-weighted means of their minutes, and retention drops exactly what is too old."""

import threading

import pytest
from sqlalchemy import select

from trimtab.contract.readings import Batch, GpuProcess, HealthEvent, NvlinkSample
from trimtab.store.ingest import BatchWriter
from trimtab.store.models import (gpu_nvlink_samples, gpu_processes, gpu_rollup_1h, gpu_rollup_1m, gpu_samples, gpus,
                                  health_events, host_samples, rollup_state)
from trimtab.store.rollup import RetentionPolicy, apply_retention, rollup, run_maintenance
from tests.store.conftest import NODE, T0_MS, count, make_batch

MIN = 60_000
HOUR = 3_600_000


def minute_rows(engine, table=gpu_rollup_1m, metric="util_pct"):
    r = table.c
    with engine.connect() as conn:
        return conn.execute(select(gpus.c.gpu_index, r.bucket_ms, r.n, r[f"{metric}_min"], r[f"{metric}_mean"],
                                   r[f"{metric}_max"]).join(gpus).order_by(gpus.c.gpu_index, r.bucket_ms)).all()


def test_complete_minutes_get_min_mean_max_and_the_open_minute_waits(engine):
    # GPU i reports util 10*i + seconds since T0: minute 0 holds seconds 0, 20, 40; minute 1 holds 60.
    BatchWriter(engine).write(make_batch([T0_MS, T0_MS + 20_000, T0_MS + 40_000, T0_MS + 60_000]))
    result = rollup(engine, now_ms=T0_MS + MIN + 30_000)
    assert minute_rows(engine) == [(0, T0_MS, 3, 0.0, 20.0, 40.0), (1, T0_MS, 3, 10.0, 30.0, 50.0)]
    assert (result.minute_buckets, result.hour_buckets, result.from_ms, result.to_ms) == (2, 2, T0_MS, T0_MS + MIN)
    with engine.connect() as conn:
        assert conn.execute(select(rollup_state.c.dirty_from_ms)).scalar_one() == T0_MS + MIN
    rollup(engine, now_ms=T0_MS + 2 * MIN)  # the minute is complete now
    assert minute_rows(engine)[1] == (0, T0_MS + MIN, 1, 60.0, 60.0, 60.0)


def test_integer_metrics_and_nulls_roll_up(engine):
    values = {0: 100, 20_000: None, 40_000: 400}
    BatchWriter(engine).write(make_batch(list(T0_MS + dt for dt in values), n_gpus=1,
                                         sm_clock_mhz=lambda i, t: values[t - T0_MS], power_w=None))
    rollup(engine, now_ms=T0_MS + MIN)
    assert minute_rows(engine, metric="sm_clock_mhz") == [(0, T0_MS, 3, 100, 250.0, 400)]
    assert minute_rows(engine, metric="power_w") == [(0, T0_MS, 3, None, None, None)]


def test_late_samples_are_rolled_up_again(engine):
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS + 10_000, T0_MS + 70_000], n_gpus=1))
    rollup(engine, now_ms=T0_MS + 2 * MIN)
    assert minute_rows(engine) == [(0, T0_MS, 1, 10.0, 10.0, 10.0), (0, T0_MS + MIN, 1, 70.0, 70.0, 70.0)]
    writer.write(make_batch([T0_MS + 5 * MIN]))  # in order: nothing old to redo
    writer.write(make_batch([T0_MS + 30_000], n_gpus=1))  # late, into an already rolled-up minute
    result = rollup(engine, now_ms=T0_MS + 6 * MIN)
    assert minute_rows(engine)[:2] == [(0, T0_MS, 2, 10.0, 20.0, 30.0), (0, T0_MS + MIN, 1, 70.0, 70.0, 70.0)]
    assert result.from_ms == T0_MS
    assert minute_rows(engine, gpu_rollup_1h)[0] == (0, T0_MS, 4, 10.0, (10 + 30 + 70 + 300) / 4, 300.0)


def test_an_hour_is_the_sample_weighted_mean_of_its_minutes(engine):
    # Minute 0: three samples of 10; minute 1: one sample of 50 → hour mean 20, not the mean of means 30.
    ts = [T0_MS, T0_MS + 1000, T0_MS + 2000, T0_MS + MIN]
    BatchWriter(engine).write(make_batch(ts, n_gpus=1, util_pct=lambda i, t: 50.0 if t == T0_MS + MIN else 10.0))
    rollup(engine, now_ms=T0_MS + HOUR + 5 * MIN)
    assert minute_rows(engine, gpu_rollup_1h) == [(0, T0_MS, 4, 10.0, 20.0, 50.0)]


def test_catching_up_over_hours_skips_the_empty_ones(engine):
    ts = [T0_MS + 5 * MIN, T0_MS + 30 * HOUR + 7 * MIN]
    BatchWriter(engine).write(make_batch(ts, n_gpus=1))
    result = rollup(engine, now_ms=T0_MS + 48 * HOUR)
    assert [(b, n) for _, b, n, *_ in minute_rows(engine, gpu_rollup_1h)] == [(T0_MS, 1), (T0_MS + 30 * HOUR, 1)]
    assert (result.minute_buckets, result.from_ms) == (2, T0_MS + 5 * MIN)
    assert rollup(engine, now_ms=T0_MS + 48 * HOUR).minute_buckets == 0


def test_rollup_of_an_empty_store_does_nothing(engine):
    assert rollup(engine, now_ms=T0_MS).minute_buckets == 0


DAY = 86_400_000
POLICY = RetentionPolicy(raw_s=2 * 86400, rollup_1m_s=5 * 86400, rollup_1h_s=10 * 86400, events_s=3 * 86400)


@pytest.mark.parametrize("chunk_rows", [3, 20_000])
def test_retention_deletes_what_is_too_old_and_keeps_the_rest(engine, chunk_rows):
    now = T0_MS + 20 * DAY
    days_ago = [12, 8, 4, 2.5, 1, 0]  # each a different table's cutoff falls between these
    ts = [int(now - d * DAY) for d in days_ago]
    batch = make_batch(ts, n_gpus=2)
    batch.processes = [GpuProcess("GPU-0000", t, pid=1) for t in ts]
    batch.events = [HealthEvent(t, "xid", f"e{t}", gpu_uuid="GPU-0001", xid=13) for t in ts]
    batch.nvlink_samples = [NvlinkSample("GPU-0000", t, link=0, tx_bytes_per_s=1e9) for t in ts]
    BatchWriter(engine).write(batch)
    rollup(engine, now + MIN)
    assert count(engine, gpu_rollup_1m) == 12 and count(engine, gpu_rollup_1h) == 12

    deleted = apply_retention(engine, now, POLICY, chunk_rows=chunk_rows)

    assert deleted == {"gpu_samples": 8, "host_samples": 4, "gpu_processes": 4, "gpu_nvlink_samples": 4,
                       "gpu_rollup_1m": 4, "gpu_rollup_1h": 2, "health_events": 3}
    with engine.connect() as conn:
        def kept(table, col="ts_ms"):
            return sorted(set(conn.execute(select(table.c[col])).scalars()))
        assert kept(gpu_samples) == kept(host_samples) == kept(gpu_processes) == ts[-2:]
        assert kept(gpu_nvlink_samples) == ts[-2:]
        assert kept(gpu_rollup_1m, "bucket_ms") == [t - t % MIN for t in ts[-4:]]
        assert kept(gpu_rollup_1h, "bucket_ms") == [t - t % HOUR for t in ts[-5:]]
        assert kept(health_events) == ts[-3:]


def test_run_maintenance_reports_both_parts(engine):
    BatchWriter(engine).write(Batch(node=NODE, events=[HealthEvent(T0_MS, "gpu_lost", "GPU 3")]))
    BatchWriter(engine).write(make_batch([T0_MS + 200 * DAY]))
    result = run_maintenance(engine, T0_MS + 200 * DAY + MIN)
    assert result.rollup.minute_buckets == 2
    assert result.deleted["health_events"] == 1 and result.deleted["gpu_samples"] == 0


def test_rollups_running_beside_a_writer_miss_no_sample(engine):
    """The rollup marks minutes done while the writer still files samples into them: those must be redone."""
    written_ms = [T0_MS]
    errors = []

    def roll():
        try:
            while written_ms[-1] < T0_MS + 4 * MIN:
                rollup(engine, now_ms=written_ms[-1] + 30_000)  # ahead of the writer: its next samples are "late"
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    roller = threading.Thread(target=roll)
    roller.start()
    writer = BatchWriter(engine)
    for k in range(0, 300, 5):
        writer.write(make_batch([T0_MS + (k + j) * 1000 for j in range(5)], host=False))
        written_ms.append(T0_MS + (k + 4) * 1000)
    roller.join()
    assert not errors
    rollup(engine, now_ms=T0_MS + HOUR)
    assert [(b, n) for _, b, n, *_ in minute_rows(engine)] == [(T0_MS + m * MIN, 60) for m in range(5)] * 2


def test_upkeep_runs_on_its_own_schedule_and_never_raises(engine, caplog):
    from sqlalchemy import create_engine

    from trimtab.store.rollup import Upkeep

    now = [1000.0]
    BatchWriter(engine).write(make_batch([T0_MS, T0_MS + 20_000]))
    upkeep = Upkeep(every_s=60.0, first_after_s=30.0, clock=lambda: now[0])
    assert upkeep.maybe_run(engine, T0_MS + 2 * MIN) is None  # not yet: the first run is 30 s after start
    now[0] += 30.0
    assert upkeep.maybe_run(engine, T0_MS + 2 * MIN).rollup is not None and len(minute_rows(engine)) == 2
    now[0] += 59.0
    assert upkeep.maybe_run(engine, T0_MS + 3 * MIN) is None  # every 60 s, however often it is asked
    now[0] += 1.0
    nobody = create_engine("postgresql+psycopg://trimtab@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    assert upkeep.maybe_run(nobody, T0_MS + 3 * MIN) is None and "store upkeep failed (will retry)" in caplog.text
    now[0] += 60.0
    assert upkeep.maybe_run(engine, T0_MS + 3 * MIN) is not None  # the next period tries again
