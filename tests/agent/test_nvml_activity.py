"""Per-process GPU activity from NVML, read off the tick, against a fake pynvml whose per-process call answers as
the H100 did (one record per busy process: its mean SM % since lastSeenTimeStamp; tests/agent/fake_pynvml.py):
the interval arithmetic (busy seconds = Σ smUtil × covered seconds), the baseline and NOT_FOUND, unknown is None
never 0, one call per GPU per read, the cheapest way picked, and a failing, lost or slow GPU leaves the reader and
the tick going."""

from __future__ import annotations

import logging
import statistics
import time

import pytest

from tests.agent import fake_pynvml as fk
from trimtab.agent.nvml import activity as nvml_activity
from trimtab.agent.nvml import source as nvml_source
from trimtab.contract.readings import EVENT_GPU_LOST, EVENT_SOURCE_ERROR

NEW, OLD = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"
UNKNOWN = (None, None, None, None, None)
S = 1_000_000  # µs
T0 = 1_700_000_000 * S  # the fake driver's clock starts at a plausible epoch time


@pytest.fixture(autouse=True)
def processes_every_tick(monkeypatch):
    monkeypatch.setattr(nvml_source, "PROCESSES_EVERY_S", 0.0)  # process rows on every tick, not every 5 s


def activity(readings, gpu: int, pid: int = None):
    """The activity fields of GPU ``gpu``'s process rows (of ``pid`` only, when given)."""
    rows = [p for p in readings.processes if p.gpu_uuid == f"GPU-fake-{gpu}" and (pid is None or p.pid == pid)]
    return [(p.sm_util_pct, p.mem_util_pct, p.util_samples, p.util_from_ms, p.util_to_ms) for p in rows]


def busy_s(row) -> float:
    """The busy seconds a row's activity says: its mean SM % over the interval it covers × that interval."""
    sm, _, _, start, end = row
    return sm / 100 * (end - start) / 1000


def events(readings, kind):
    return [e for e in readings.events if e.kind == kind]


def driven(install, fake, **kwargs):
    """A source over ``fake`` whose readers take the fake driver's clock as the wall clock."""
    fake.activity_now_us = T0
    source = install(fake, **kwargs)
    for gpu in source._gpus:
        if gpu.activity is not None:
            gpu.activity._clock = lambda: fake.activity_now_us / 1e6
    return source


def read_at(source, fake, at_us: int) -> None:
    fake.activity_now_us = at_us
    source.read_activity()


def test_busy_seconds_are_smutil_times_the_covered_time_summed_over_reads(install):
    fake = fk.FakeNvml(n_gpus=1)
    gen, rew = 1000, 2000  # the fake's context holder is pid 1000; 2000 holds none (its time is not dropped)
    # generation busy 0.6 s then reward 0.3 s of every second, for 10 s from T0 + 1 s, at 100 % SM
    fake.activity_busy[0] = [(gen, T0 + s * S, T0 + s * S + 600_000, 100.0) for s in range(1, 11)] + \
                            [(rew, T0 + s * S + 600_000, T0 + s * S + 900_000, 100.0) for s in range(1, 11)]
    fake.activity_busy[0].append((gen, T0 - 5 * S, T0 - 4 * S, 100.0))  # before the agent: the baseline's
    source = driven(install, fake)
    read_at(source, fake, T0 + 1 * S + 300_000)  # the pick and the baseline
    for k in range(2, 12):
        read_at(source, fake, T0 + k * S + 300_000)  # 1 s reads, off the process-list cadence
        if k == 6:
            first = source.sample(6_000)
    second = source.sample(11_000)
    rows = {pid: activity(first, 0, pid) + activity(second, 0, pid) for pid in (gen, rew)}
    # covered: from the baseline's read (1.3 s) to the last read (11.3 s): generation busy 0.3 s of its first
    # span and 9 whole ones, reward all 10 of its own
    assert sum(busy_s(r) for r in rows[gen]) == pytest.approx(0.3 + 9 * 0.6, rel=0.01)
    assert sum(busy_s(r) for r in rows[rew]) == pytest.approx(10 * 0.3, rel=0.01)
    assert [r[2] for r in rows[gen]] == [5, 5]  # one record per read it was busy in (reads 2–6, 7–11)
    # both pids' rows cover the same contiguous interval of the GPU, on NVML's clock (epoch ms)
    assert rows[gen][0][3:] == rows[rew][0][3:] and rows[gen][0][4] == rows[gen][1][3]
    assert all(0 < r[0] <= 100 and r[1] == pytest.approx(r[0] / 2, abs=1) for r in rows[gen] + rows[rew])
    assert fake.count(NEW, 0) + fake.count(OLD, 0) == 2 * nvml_activity.PICK_CALLS + 11  # one call a GPU a read


def test_the_first_answer_is_a_baseline_and_before_it_every_pid_is_unknown(install):
    fake = fk.FakeNvml(n_gpus=1)
    source = driven(install, fake)
    read_at(source, fake, T0 + S)  # NOT_FOUND: NVML's clock not seen yet
    assert activity(source.sample(1_000), 0) == [UNKNOWN]
    fake.activity_busy[0] = [(1000, T0 + 2 * S, T0 + 3 * S, 50.0)]
    read_at(source, fake, T0 + 3 * S)  # records: the baseline, dropped
    assert activity(source.sample(2_000), 0) == [UNKNOWN]
    fake.activity_busy[0].append((1000, T0 + 3 * S, T0 + 4 * S, 50.0))
    read_at(source, fake, T0 + 4 * S)
    assert activity(source.sample(3_000), 0) == [(50.0, 25.0, 1, (T0 + 3 * S) // 1000, (T0 + 4 * S) // 1000)]


def test_not_found_after_the_baseline_is_idle_and_moves_last_seen_so_a_record_covers_about_one_read(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.activity_busy[0] = [(1000, T0, T0 + S, 100.0), (1000, T0 + 30 * S, T0 + 31 * S, 40.0)]
    source = driven(install, fake)
    read_at(source, fake, T0 + S)  # baseline at T0 + 1 s; NVML's clock agrees with the wall clock (lag 0)
    for k in range(2, 30):
        read_at(source, fake, T0 + k * S)  # 28 s idle: NOT_FOUND every read
    idle = source.sample(1_000)
    margin = nvml_activity.NOT_FOUND_MARGIN_US
    assert activity(idle, 0) == [(0.0, 0.0, 0, (T0 + S) // 1000, (T0 + 29 * S - margin) // 1000)]
    # lastSeenTimeStamp moved on with the idle reads: each passed the previous one's wall time less the margin
    assert fake.activity_since[-1] == (0, T0 + 28 * S - margin)
    assert source._gpus[0].activity.last_seen_us == T0 + 29 * S - margin
    read_at(source, fake, T0 + 31 * S)
    row = activity(source.sample(2_000), 0)[0]
    # 0.4 s over the 3 s the record covers: 13.3 %, which NVML gives in whole percent (±0.5 % × 3 s)
    assert row[3] == (T0 + 29 * S - margin) // 1000 and busy_s(row) == pytest.approx(0.4, abs=0.015)


def test_without_proof_that_nvmls_clock_is_the_wall_clock_not_found_leaves_last_seen(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.activity_busy[0] = [(1000, T0, T0 + S, 100.0), (1000, T0 + 2 * S, T0 + 3 * S, 60.0)]
    source = driven(install, fake)
    source._gpus[0].activity._clock = lambda: fake.activity_now_us / 1e6 + 3600  # an hour apart
    read_at(source, fake, T0 + S)
    read_at(source, fake, T0 + 2 * S)  # NOT_FOUND: no interval read
    assert activity(source.sample(1_000), 0) == [UNKNOWN]
    read_at(source, fake, T0 + 3 * S)  # covers the idle read and the busy second: 0.6 s over 2 s
    row = activity(source.sample(2_000), 0)[0]
    assert row == (30.0, 15.0, 1, (T0 + S) // 1000, (T0 + 3 * S) // 1000) and busy_s(row) == pytest.approx(0.6)


def test_the_cheapest_way_that_answers_is_used(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.activity_delay_s[NEW] = 0.005  # the newer function is the slower one on this driver
    source = driven(install, fake)
    read_at(source, fake, T0 + S)
    gpu_activity = source._gpus[0].activity
    assert gpu_activity.function_name == OLD and set(gpu_activity.pick_costs_s) == {NEW, OLD}
    assert gpu_activity.pick_costs_s[NEW] > gpu_activity.pick_costs_s[OLD]
    for k in range(2, 5):
        read_at(source, fake, T0 + k * S)
    assert (fake.count(NEW, 0), fake.count(OLD, 0)) == (nvml_activity.PICK_CALLS, nvml_activity.PICK_CALLS + 4)


def test_not_supported_leaves_the_activity_unknown_and_is_asked_once(install):
    fake = fk.FakeNvml(n_gpus=2)
    fake.fail(NEW, fk.NOT_SUPPORTED, gpu=0)
    fake.fail(OLD, fk.NOT_SUPPORTED, gpu=0)
    fake.activity_busy[1] = [(1001, T0, T0 + 10 * S, 100.0)]
    source = driven(install, fake)
    ticks = []
    for k in range(1, 5):
        read_at(source, fake, T0 + k * S)
        ticks.append(source.sample(1_000 * k))
    assert all(activity(r, 0) == [UNKNOWN] for r in ticks)  # NULL, never 0
    assert activity(ticks[-1], 1) == [(100.0, 50.0, 1, (T0 + 3 * S) // 1000, (T0 + 4 * S) // 1000)]
    assert (fake.count(NEW, 0), fake.count(OLD, 0)) == (1, 1)  # each tried once, then never again
    assert (0, "process_utilization") in source.unsupported()
    assert not any(r.events for r in ticks)


def test_the_older_call_is_used_where_the_newer_one_is_missing(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.fail(NEW, fk.FUNCTION_NOT_FOUND)
    fake.activity_busy[0] = [(1000, T0, T0 + 10 * S, 100.0)]
    source = driven(install, fake)
    for k in range(1, 4):
        read_at(source, fake, T0 + k * S)
    assert activity(source.sample(1_000), 0) == [(100.0, 50.0, 2, (T0 + S) // 1000, (T0 + 3 * S) // 1000)]
    assert (fake.count(NEW, 0), fake.count(OLD, 0)) == (1, nvml_activity.PICK_CALLS + 3)
    assert source.unsupported() == [] and source._gpus[0].activity.function_name == OLD


def test_a_failing_call_leaves_the_reader_going_is_counted_said_once_and_the_interval_resumes(install, caplog):
    fake = fk.FakeNvml(n_gpus=2)
    fake.activity_busy = {0: [(1000, T0, T0 + 10 * S, 100.0)], 1: [(1001, T0, T0 + 10 * S, 100.0)]}
    source = driven(install, fake)
    read_at(source, fake, T0 + S)  # the baseline of both GPUs
    fake.fail(NEW, fk.UNKNOWN, gpu=0)
    fake.fail(OLD, fk.UNKNOWN, gpu=0)  # whichever way the pick kept
    with caplog.at_level(logging.INFO, logger="trimtab.agent.nvml.activity"):
        failing = []
        for k in (2, 3, 4):
            read_at(source, fake, T0 + k * S)
            failing.append(source.sample(1_000 * k))
        for r in failing:
            assert len(r.gpu_samples) == 2 and len(r.processes) == 2  # the other readings go on
            assert activity(r, 0) == [UNKNOWN]  # no read answered in the interval: unknown, not 0
            assert activity(r, 1)[0][:3] == (100.0, 50.0, 1)
        assert sum(len(events(r, EVENT_SOURCE_ERROR)) for r in failing) == 1
        assert source.activity_failed_calls() == {0: 3, 1: 0}
        del fake.failures[(NEW, 0)], fake.failures[(OLD, 0)]
        read_at(source, fake, T0 + 5 * S)
        back = source.sample(5_000)
    # the failed calls did not move lastSeenTimeStamp: the read covers the 4 s since the baseline whole
    assert activity(back, 0) == [(100.0, 50.0, 1, (T0 + S) // 1000, (T0 + 5 * S) // 1000)]
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO"]  # once as it fails, once as it answers again
    assert "reading process_utilization failed" in said[0][1] and "answers again" in said[1][1]


def test_an_exception_that_is_no_nvml_error_is_counted_and_ends_nothing(install):
    fake = fk.FakeNvml(n_gpus=2)

    def broken(handle, last_seen_us):
        raise RuntimeError("bindings broke")

    fake.module.nvmlDeviceGetProcessesUtilizationInfo = broken
    fake.module.nvmlDeviceGetProcessUtilization = broken
    source = driven(install, fake)
    ticks = []
    for k in range(1, 4):
        read_at(source, fake, T0 + k * S)
        ticks.append(source.sample(1_000 * k))
    assert all(len(r.gpu_samples) == 2 and activity(r, 1) == [UNKNOWN] for r in ticks)
    assert source.activity_failed_calls() == {0: 3, 1: 3}
    assert sum(len(events(r, EVENT_SOURCE_ERROR)) for r in ticks) == 2  # once per GPU


def test_a_gpu_lost_in_this_call_is_retired_and_the_reader_reads_the_others(install):
    fake = fk.FakeNvml(n_gpus=3)
    fake.activity_busy = {g: [(1000 + g, T0, T0 + 10 * S, 100.0)] for g in range(3)}
    source = driven(install, fake)
    read_at(source, fake, T0 + S)
    source.sample(1_000)
    fake.fail(NEW, fk.GPU_IS_LOST, gpu=1)
    fake.fail(OLD, fk.GPU_IS_LOST, gpu=1)
    read_at(source, fake, T0 + 2 * S)  # GPU 1 is read before GPU 2
    lost = source.sample(2_000)
    assert [s.gpu_uuid for s in lost.gpu_samples] == ["GPU-fake-0", "GPU-fake-2"]
    assert [e.gpu_uuid for e in events(lost, EVENT_GPU_LOST)] == ["GPU-fake-1"]
    assert activity(lost, 1) == [] and activity(lost, 2)[0][:3] == (100.0, 50.0, 1)
    read_at(source, fake, T0 + 3 * S)
    assert activity(source.sample(3_000), 0)[0][3:] == ((T0 + 2 * S) // 1000, (T0 + 3 * S) // 1000)
    # the pick, the baseline and the read that found it lost; never asked again
    assert fake.count(NEW, 1) + fake.count(OLD, 1) == 2 * nvml_activity.PICK_CALLS + 2


def test_the_tick_does_not_wait_on_a_slow_per_process_call(install):
    fake = fk.FakeNvml(n_gpus=2)
    fake.activity_delay_s = {NEW: 0.05, OLD: 0.05}  # 50 ms a call: 18× what an H100 took
    fake.activity_busy = {g: [(1000 + g, 0, 10**20, 100.0)] for g in range(2)}
    fake.activity_now_us = int(time.time() * 1e6)
    source = install(fake, activity_every_s=0.01)  # the reader's thread, calling back to back
    without = install(fk.FakeNvml(n_gpus=2), process_activity=False)

    def ticks(src) -> list[float]:
        spent = []
        for k in range(40):
            fake.activity_now_us = int(time.time() * 1e6)
            started = time.perf_counter()
            src.sample(1_000 * k)  # process rows on every tick: the tick takes the reader's tally each time
            spent.append(time.perf_counter() - started)
            time.sleep(0.005)
        return spent

    slow, bare = ticks(source), ticks(without)
    reads = fake.count(NEW, 0) + fake.count(OLD, 0)
    assert reads >= 2 * nvml_activity.PICK_CALLS + 1  # the thread was reading all along
    # the reads' 50 ms never land on a tick: the median stays far below it (and near the tick without them)
    assert statistics.median(slow) < 0.01, (statistics.median(slow), statistics.median(bare))
    assert sorted(slow)[len(slow) * 9 // 10] < 0.025


def test_a_cadence_that_is_no_positive_number_of_seconds_is_refused(install):
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            install(fk.FakeNvml(n_gpus=1), activity_every_s=bad)


def test_a_process_whose_last_sample_came_early_in_a_read_is_credited_the_whole_read(install):
    """NVML's record is a process's mean over the whole read, whatever the moment of its last busy sample: crediting
    it only up to that moment under-counted the process that ran first in each read (0.63× on the H200)."""
    fake = fk.FakeNvml(n_gpus=1)
    first, second = 1000, 2000
    # first busy 0.2 s at the start of every second, second 0.5 s at its end
    fake.activity_busy[0] = [(first, T0 + s * S, T0 + s * S + 200_000, 100.0) for s in range(0, 12)] + \
                            [(second, T0 + s * S + 500_000, T0 + s * S + 1_000_000, 100.0) for s in range(0, 12)]
    source = driven(install, fake)
    for k in range(1, 12):
        read_at(source, fake, T0 + k * S + 990_000)  # each read just before the next second starts
    readings = source.sample(11_000)
    rows = {pid: activity(readings, 0, pid) for pid in (first, second)}
    # covered (1.99, 11.99]: ten whole seconds, so 10 × 0.2 s and 10 × 0.5 s (less the 10 ms each read cuts off)
    assert sum(busy_s(r) for r in rows[first]) == pytest.approx(10 * 0.2, rel=0.02)
    assert sum(busy_s(r) for r in rows[second]) == pytest.approx(10 * 0.49 + 0.01, rel=0.02)


def test_a_stale_baseline_does_not_hold_last_seen_seconds_behind_the_idle_reads(install):
    """The baseline taken while the processes load (their last kernels 3 s before the read): the newest record
    trails the wall clock by 3 s, which is staleness, not NVML's write delay. The idle reads after it still move
    lastSeenTimeStamp to within the margin and ``LAG_MAX_US`` of each read, so the first busy record after them
    covers about one read (on the H100 the first row after such a start read 2.5× the processes' own busy time)."""
    fake = fk.FakeNvml(n_gpus=1)
    fake.activity_stamp_last_busy = True
    fake.activity_busy[0] = [(1000, T0, T0 + S, 100.0), (1000, T0 + 20 * S, T0 + 21 * S, 50.0)]
    source = driven(install, fake)
    read_at(source, fake, T0 + 4 * S)  # baseline: the record stamped T0 + 1 s, 3 s before the read
    for k in range(5, 21):
        read_at(source, fake, T0 + k * S)  # idle: NOT_FOUND
    reader = source._gpus[0].activity
    assert reader._lag_us == nvml_activity.LAG_MAX_US
    assert reader.last_seen_us == T0 + 20 * S - nvml_activity.LAG_MAX_US - nvml_activity.NOT_FOUND_MARGIN_US
