"""The NVML source against a fake pynvml: unsupported is asked once, a lost GPU leaves the others sampling,
errors are said once, NVLink is NULL without links, nothing blocking runs on the tick, and no driver means a
helpful SourceUnavailable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.agent import fake_pynvml as fk
from trimtab.agent.nvml import NvmlSource
from trimtab.agent.nvml import gpm as nvml_gpm
from trimtab.agent.nvml import slow as nvml_slow
from trimtab.contract.readings import EVENT_GPU_LOST, EVENT_SOURCE_ERROR, EVENT_XID
from trimtab.agent.source import SourceUnavailable


def by_uuid(readings):
    return {s.gpu_uuid: s for s in readings.gpu_samples}


def events(readings, kind):
    return [e for e in readings.events if e.kind == kind]


def test_not_supported_reads_none_and_is_never_asked_again(install):
    fake = fk.FakeNvml(n_gpus=2)
    fake.fail("nvmlDeviceGetPowerUsage", fk.NOT_SUPPORTED, gpu=0)
    source = install(fake)
    for tick in range(5):
        samples = by_uuid(source.sample(tick))
        assert samples["GPU-fake-0"].power_w is None
        assert samples["GPU-fake-1"].power_w == 150.0
    assert fake.count("nvmlDeviceGetPowerUsage", 0) == 1
    assert fake.count("nvmlDeviceGetPowerUsage", 1) == 5
    assert (0, "power") in source.unsupported()


def test_a_gpu_lost_mid_run_leaves_the_others_sampling(install):
    fake = fk.FakeNvml(n_gpus=3)
    source = install(fake)
    assert len(source.sample(1).gpu_samples) == 3

    fake.fail("nvmlDeviceGetMemoryInfo", fk.GPU_IS_LOST, gpu=1)
    lost_tick = source.sample(2)
    assert set(by_uuid(lost_tick)) == {"GPU-fake-0", "GPU-fake-2"}
    assert [e.gpu_uuid for e in events(lost_tick, EVENT_GPU_LOST)] == ["GPU-fake-1"]
    assert all(p.gpu_uuid != "GPU-fake-1" for p in lost_tick.processes)

    calls_before = fake.count("nvmlDeviceGetUtilizationRates", 1)
    for tick in range(3, 6):
        later = source.sample(tick)
        assert set(by_uuid(later)) == {"GPU-fake-0", "GPU-fake-2"}
        assert not events(later, EVENT_GPU_LOST)
    assert fake.count("nvmlDeviceGetUtilizationRates", 1) == calls_before  # the lost GPU is left alone
    assert fake.count("nvmlDeviceGetUtilizationRates", 0) == 5
    assert [g.uuid for g in source.inventory().gpus] == ["GPU-fake-0", "GPU-fake-1", "GPU-fake-2"]


def test_an_unknown_error_reads_none_and_is_reported_once_not_every_tick(install):
    fake = fk.FakeNvml(n_gpus=2)
    fake.fail("nvmlDeviceGetClockInfo", fk.UNKNOWN, gpu=1)
    source = install(fake)
    ticks = [source.sample(t) for t in range(4)]
    assert all(by_uuid(r)["GPU-fake-1"].sm_clock_mhz is None for r in ticks)
    assert all(by_uuid(r)["GPU-fake-0"].sm_clock_mhz == 1500 for r in ticks)
    errors = [e for r in ticks for e in events(r, EVENT_SOURCE_ERROR)]
    assert len(errors) == 1 and errors[0].gpu_uuid == "GPU-fake-1" and "sm_clock" in errors[0].detail
    assert fake.count("nvmlDeviceGetClockInfo", 1) == 4  # a transient error is retried, just not re-reported


def test_a_second_different_error_on_the_same_metric_is_reported_too(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.fail("nvmlDeviceGetClockInfo", fk.UNKNOWN)
    source = install(fake)
    first = source.sample(1)
    fake.fail("nvmlDeviceGetClockInfo", fk.TIMEOUT)
    second = source.sample(2)
    third = source.sample(3)
    assert [len(events(r, EVENT_SOURCE_ERROR)) for r in (first, second, third)] == [1, 1, 0]


def test_nvlink_is_none_not_zero_on_a_gpu_without_links(install, monkeypatch):
    monkeypatch.setattr(nvml_gpm, "GPM_MIN_INTERVAL_S", -1.0)
    for gpm in (False, True):
        source = install(fk.FakeNvml(n_gpus=1, gpm=gpm, nvlink_links=0))
        source.refresh_slow_metrics()
        assert source.inventory().gpus[0].nvlink_link_count is None
        for tick in range(3):
            sample = source.sample(tick).gpu_samples[0]
            assert sample.nvlink_tx_bytes_per_s is None and sample.nvlink_rx_bytes_per_s is None
        source.close()


def test_nvlink_rate_from_field_values_and_none_across_a_counter_reset(install):
    ok = fk._real.NVML_SUCCESS
    fake = fk.FakeNvml(n_gpus=1, nvlink_links=18)
    source = install(fake)
    assert source.inventory().gpus[0].nvlink_link_count == 18

    fake.field_values[0] = [(1_000, 1_000_000, ok), (5_000, 1_000_000, ok)]
    source.refresh_slow_metrics()
    assert source.sample(1).gpu_samples[0].nvlink_tx_bytes_per_s is None  # one reading: no rate yet
    fake.field_values[0] = [(3_000, 3_000_000, ok), (9_000, 3_000_000, ok)]  # +2000 KiB, +4000 KiB in 2 s
    source.refresh_slow_metrics()
    s = source.sample(2).gpu_samples[0]
    assert s.nvlink_tx_bytes_per_s == pytest.approx(1000 * 1024)
    assert s.nvlink_rx_bytes_per_s == pytest.approx(2000 * 1024)
    fake.field_values[0] = [(10, 4_000_000, ok), (9_500, 4_000_000, ok)]  # tx went backwards: reset
    source.refresh_slow_metrics()
    s = source.sample(3).gpu_samples[0]
    assert s.nvlink_tx_bytes_per_s is None
    assert s.nvlink_rx_bytes_per_s == pytest.approx(500 * 1024)

    fake.field_values[0] = [(20, 5_000_000, fk.NOT_SUPPORTED), (9_600, 5_000_000, ok)]  # a value's own return
    source.refresh_slow_metrics()
    s = source.sample(4).gpu_samples[0]
    assert s.nvlink_tx_bytes_per_s is None and s.nvlink_rx_bytes_per_s is None


def test_pcie_throughput_is_read_off_the_tick_and_goes_stale(install, monkeypatch):
    fake = fk.FakeNvml(n_gpus=2)
    source = install(fake)
    for tick in range(3):
        source.sample(tick)
    assert fake.count("nvmlDeviceGetPcieThroughput", 0) == 0  # never on the tick
    source.refresh_slow_metrics()
    assert fake.count("nvmlDeviceGetPcieThroughput", 0) == 2  # TX and RX
    s = source.sample(3).gpu_samples[0]
    assert s.pcie_tx_bytes_per_s == s.pcie_rx_bytes_per_s == 1000 * 1024
    monkeypatch.setattr(nvml_slow.time, "monotonic", lambda: 1e12)  # far later, no refresh since
    assert source.sample(4).gpu_samples[0].pcie_tx_bytes_per_s is None


def test_gpm_metrics_are_read_and_an_unsupported_one_is_dropped_from_the_request(install, monkeypatch):
    monkeypatch.setattr(nvml_gpm, "GPM_MIN_INTERVAL_S", -1.0)
    fake = fk.FakeNvml(n_gpus=1, gpm=True)
    fake.gpm_returns[fk._real.NVML_GPM_METRIC_DRAM_BW_UTIL] = fk.NOT_SUPPORTED
    source = install(fake)
    assert source._slow._thread is None  # GPM covers PCIe: no blocking reads at all
    first = source.sample(1).gpu_samples[0]
    assert first.sm_active_pct is None  # one GPM sample: nothing to compare with yet
    second = source.sample(2).gpu_samples[0]
    assert second.sm_active_pct == 42.0 and second.tensor_active_pct == 42.0
    assert second.pcie_tx_bytes_per_s == 42.0 * 1024 * 1024  # MiB/s → bytes/s
    assert second.dram_bw_util_pct is None
    assert (0, "gpm:dram_bw_util_pct") in source.unsupported()
    request = source._gpus[0].gpm.request
    asked = {request.metrics[i].metricId for i in range(request.numMetrics)}
    assert fk._real.NVML_GPM_METRIC_DRAM_BW_UTIL not in asked
    assert asked.isdisjoint({60, 61})  # no NVLink: never asked for NVLink rates
    assert fake.count("nvmlDeviceGetPcieThroughput", 0) == 0


def test_deprecated_calls_are_the_fallback_only(install):
    fake = fk.FakeNvml(n_gpus=1)
    del fake.module.nvmlDeviceGetTemperatureV  # bindings older than TemperatureV
    fake.fail("nvmlDeviceGetCurrentClocksEventReasons", fk.FUNCTION_NOT_FOUND)  # driver older than the call
    source = install(fake)
    for tick in range(3):
        s = source.sample(tick).gpu_samples[0]
        assert s.temperature_c == 41.0 and s.clock_event_mask == 0
    assert fake.count("nvmlDeviceGetCurrentClocksEventReasons", 0) == 1
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 3

    modern = fk.FakeNvml(n_gpus=1)
    source = install(modern)
    assert source.sample(1).gpu_samples[0].temperature_c == 40.0
    assert modern.count("nvmlDeviceGetTemperature", 0) == 0
    assert modern.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 0


def test_an_xid_becomes_one_event_with_its_number(install):
    fake = fk.FakeNvml(n_gpus=2)
    source = install(fake)
    fake.xid_queue.append((1, 79))
    xids = events(source.sample(1), EVENT_XID)
    assert [(e.gpu_uuid, e.xid) for e in xids] == [("GPU-fake-1", 79)]
    assert not events(source.sample(2), EVENT_XID)


def test_events_not_supported_is_fine(install):
    fake = fk.FakeNvml(n_gpus=1)
    fake.fail("nvmlDeviceRegisterEvents", fk.NOT_SUPPORTED)
    fake.fail("nvmlEventSetWait_v2", fk.NOT_SUPPORTED)
    source = install(fake)
    assert not source.sample(1).events and not source.sample(2).events
    assert fake.count("nvmlEventSetWait_v2") == 1


@pytest.mark.parametrize("code", [fk._real.NVML_ERROR_LIBRARY_NOT_FOUND, fk._real.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_is_source_unavailable_suggesting_simulate(install, code):
    with pytest.raises(SourceUnavailable, match="--simulate N") as info:
        install(fk.FakeNvml(init_error=code))
    assert "no NVIDIA driver" in str(info.value)


def test_no_bindings_is_source_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(SourceUnavailable, match="nvidia-ml-py"):
        NvmlSource()


def test_the_real_bindings_without_a_driver_say_so():
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(SourceUnavailable, match="--simulate"):
        NvmlSource()


def test_importing_the_source_needs_no_pynvml():
    code = "import sys, trimtab.agent.nvml, trimtab.agent; assert 'pynvml' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


