"""The NVML source on a real GPU (the lent H200; skipped without a driver): what the fake-based tests may not
claim, because the fake is for error paths only."""

from __future__ import annotations

import time

import pytest

from trimtab.agent.source import SourceUnavailable

pytestmark = pytest.mark.gpu


@pytest.fixture
def source():
    from trimtab.agent.nvml import NvmlSource

    try:
        src = NvmlSource()
    except SourceUnavailable as exc:
        pytest.skip(f"no NVIDIA driver here: {exc}")
    yield src
    src.close()


def test_inventory_names_each_gpu_with_its_link_peak(source):
    inv = source.inventory()
    assert inv.gpus and inv.driver_version and not inv.simulated
    for g in inv.gpus:
        assert g.uuid.startswith("GPU-") and g.name
        assert g.pcie_max_gen and g.pcie_max_width and g.pcie_peak_bytes_per_s > 1e9
        assert g.memory_total_bytes > 1e9


def test_memory_comes_from_v2_with_the_driver_reservation(source):
    s = source.sample(int(time.time() * 1000)).gpu_samples[0]
    assert s.mem_reserved_bytes is not None and s.mem_reserved_bytes > 0
    assert s.mem_used_bytes + s.mem_reserved_bytes <= s.mem_total_bytes


def test_gpm_needs_two_samples_over_100_ms_apart(source):
    if not source.inventory().gpus[0].gpm_supported:
        pytest.skip("GPU without GPM")
    source.sample(int(time.time() * 1000))
    time.sleep(0.2)
    s = source.sample(int(time.time() * 1000)).gpu_samples[0]
    assert s.sm_active_pct is not None and s.pcie_tx_bytes_per_s is not None
    soon = source.sample(int(time.time() * 1000)).gpu_samples[0]  # < 100 ms later: no GPM reading
    assert soon.sm_active_pct is None


def test_the_process_list_is_read_every_few_seconds_not_every_tick():
    from trimtab.agent.nvml import NvmlSource

    calls = []
    try:
        src = NvmlSource(on_call=lambda metric, s: calls.append(metric))
    except SourceUnavailable as exc:
        pytest.skip(f"no NVIDIA driver here: {exc}")
    try:
        for _ in range(3):
            src.sample(int(time.time() * 1000))
        n_gpus = len(src.inventory().gpus)
        assert calls.count("processes") == n_gpus
        assert calls.count("util") == 3 * n_gpus
    finally:
        src.close()


def test_the_index_filter_and_close(source):
    from trimtab.agent.nvml import NvmlSource

    only = NvmlSource(indices=[0])
    try:
        assert [g.index for g in only.inventory().gpus] == [0]
    finally:
        only.close()


def test_the_per_process_utilization_call_is_off_the_tick():
    from trimtab.agent.nvml import NvmlSource

    calls = []
    try:
        src = NvmlSource(on_call=lambda metric, s: calls.append(metric), activity_every_s=None)
    except SourceUnavailable as exc:
        pytest.skip(f"no NVIDIA driver here: {exc}")
    try:
        for _ in range(3):
            src.sample(int(time.time() * 1000))
        assert calls.count("process_utilization") == 0  # the tick never makes it
        src.read_activity()  # what the reader's thread does every ACTIVITY_EVERY_S
        supported = [g for g, _ in src.tick_calls() if g.activity is not None and g.activity.supported]
        assert calls.count("process_utilization") == len(supported)  # one call per GPU per read
    finally:
        src.close()
