"""Per-process GPU activity from NVML, its error paths against a fake pynvml (the happy path, samples added up per
pid, is the simulated node's and the store's, tests/agent/test_simulated.py and tests/store/test_ingest.py): no
sample since is 0 over the interval, unsupported and unanswered are unknown (None, never 0), one call per GPU per
tick, and a failing or lost GPU leaves the tick and the other GPUs going."""

from __future__ import annotations

import logging

import pytest

from tests.agent import fake_pynvml as fk
from trimtab.agent.nvml import source as nvml_source
from trimtab.contract.readings import EVENT_GPU_LOST, EVENT_SOURCE_ERROR

NEW, OLD = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"
UNKNOWN = (None, None, None, None, None)


@pytest.fixture(autouse=True)
def processes_every_tick(monkeypatch):
    monkeypatch.setattr(nvml_source, "PROCESSES_EVERY_S", 0.0)  # process rows on every tick, not every 5 s


def activity(readings, gpu: int):
    """The activity fields of GPU ``gpu``'s process rows (the fake has one process a GPU)."""
    rows = [p for p in readings.processes if p.gpu_uuid == f"GPU-fake-{gpu}"]
    return [(p.sm_util_pct, p.mem_util_pct, p.util_samples, p.util_from_ms, p.util_to_ms) for p in rows]


def events(readings, kind):
    return [e for e in readings.events if e.kind == kind]


def test_no_sample_since_is_idle_over_the_interval_after_a_baseline_that_is_unknown(install):
    fake = fk.FakeNvml(n_gpus=2)
    source = install(fake)
    first, second, third = (source.sample(ts) for ts in (1_000, 2_000, 3_000))
    assert activity(first, 0) == [UNKNOWN]  # the baseline: what NVML held before the agent is no interval of ours
    assert activity(second, 0) == [(0.0, 0.0, 0, 1_000, 2_000)]  # NOT_FOUND: nobody busy since, an answer
    assert activity(third, 1) == [(0.0, 0.0, 0, 2_000, 3_000)]
    assert fake.count(NEW, 0) == fake.count(NEW, 1) == 3 and fake.count(OLD, 0) == 0  # one call a GPU a tick
    assert not third.events and source.activity_failed_calls() == {0: 0, 1: 0}


def test_not_supported_leaves_the_activity_unknown_and_is_asked_once(install):
    fake = fk.FakeNvml(n_gpus=2)
    fake.fail(NEW, fk.NOT_SUPPORTED, gpu=0)
    fake.fail(OLD, fk.NOT_SUPPORTED, gpu=0)
    source = install(fake)
    ticks = [source.sample(1_000 * t) for t in range(1, 5)]
    assert all(activity(r, 0) == [UNKNOWN] for r in ticks)
    assert activity(ticks[-1], 1) == [(0.0, 0.0, 0, 3_000, 4_000)]
    assert (fake.count(NEW, 0), fake.count(OLD, 0)) == (1, 1)  # the older call tried once too, then never again
    assert (0, "process_utilization") in source.unsupported()
    assert not any(r.events for r in ticks)


def test_the_older_call_is_used_where_the_newer_one_is_missing(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.fail(NEW, fk.FUNCTION_NOT_FOUND)
    source = install(fake)
    ticks = [source.sample(1_000 * t) for t in range(1, 4)]
    assert activity(ticks[-1], 0) == [(0.0, 0.0, 0, 2_000, 3_000)]
    assert (fake.count(NEW, 0), fake.count(OLD, 0)) == (1, 3)
    assert source.unsupported() == []


def test_a_failing_call_leaves_the_tick_going_is_counted_said_once_and_the_interval_resumes(install, caplog):
    fake = fk.FakeNvml(n_gpus=2)
    source = install(fake)
    source.sample(1_000)  # the baseline of both GPUs
    fake.fail(NEW, fk.UNKNOWN, gpu=0)
    with caplog.at_level(logging.INFO, logger="trimtab.agent.nvml.activity"):
        failing = [source.sample(ts) for ts in (2_000, 3_000, 4_000)]
        for r in failing:
            assert len(r.gpu_samples) == 2 and len(r.processes) == 2  # the other readings go on
            assert activity(r, 0) == [UNKNOWN]  # no call answered in the interval: unknown, not 0
            assert activity(r, 1)[0][:3] == (0.0, 0.0, 0)
        assert sum(len(events(r, EVENT_SOURCE_ERROR)) for r in failing) == 1
        assert source.activity_failed_calls() == {0: 3, 1: 0}
        del fake.failures[(NEW, 0)]
        back = source.sample(5_000)
    # the calls that failed did not move NVML's "last seen" on: the interval since the baseline is read whole
    assert activity(back, 0) == [(0.0, 0.0, 0, 1_000, 5_000)]
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO"]  # once as it fails, once as it answers again
    assert "reading process_utilization failed" in said[0][1] and "answers again" in said[1][1]


def test_an_exception_that_is_no_nvml_error_is_counted_and_ends_nothing(install):
    fake = fk.FakeNvml(n_gpus=2)

    def broken(handle, last_seen_us):
        raise RuntimeError("bindings broke")

    fake.module.nvmlDeviceGetProcessesUtilizationInfo = broken
    source = install(fake)
    ticks = [source.sample(1_000 * t) for t in range(1, 4)]
    assert all(len(r.gpu_samples) == 2 and activity(r, 1) == [UNKNOWN] for r in ticks)
    assert source.activity_failed_calls() == {0: 3, 1: 3}
    assert sum(len(events(r, EVENT_SOURCE_ERROR)) for r in ticks) == 2  # once per GPU


def test_a_gpu_lost_in_this_call_is_retired_and_the_others_keep_their_activity(install):
    fake = fk.FakeNvml(n_gpus=2)
    source = install(fake)
    source.sample(1_000)
    fake.fail(NEW, fk.GPU_IS_LOST, gpu=1)
    lost = source.sample(2_000)
    assert [s.gpu_uuid for s in lost.gpu_samples] == ["GPU-fake-0"]
    assert [e.gpu_uuid for e in events(lost, EVENT_GPU_LOST)] == ["GPU-fake-1"]
    assert activity(lost, 1) == [] and activity(lost, 0) == [(0.0, 0.0, 0, 1_000, 2_000)]
    later = source.sample(3_000)
    assert activity(later, 0) == [(0.0, 0.0, 0, 2_000, 3_000)] and fake.count(NEW, 1) == 2
