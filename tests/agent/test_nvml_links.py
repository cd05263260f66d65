"""Per-link NVLink from the NVML source (against a fake pynvml, which answers field values scoped by link): rates
off the tick, handed to one tick per refresh, None across a reset, an unsupported value left out for good, and
nothing at all for a GPU without NVLink."""

from __future__ import annotations

import pytest

from tests.agent import fake_pynvml as fk

TX, RX = fk._real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, fk._real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
OK = fk._real.NVML_SUCCESS


def link_values(fake: fk.FakeNvml, gpu: int, us: int, kib: dict[int, tuple[int, int]], ret: int = OK) -> None:
    """Each link's cumulative (tx KiB, rx KiB) at ``us``."""
    fake.link_values[gpu] = {key: value for link, (tx, rx) in kib.items()
                             for key, value in (((TX, link), (tx, us, ret)), ((RX, link), (rx, us, ret)))}


def per_link(readings) -> dict[tuple[str, int], tuple]:
    return {(n.gpu_uuid, n.link): (n.tx_bytes_per_s, n.rx_bytes_per_s) for n in readings.nvlink_samples}


def test_per_link_rates_come_once_per_refresh_from_one_call_for_all_links(install):
    fake = fk.FakeNvml(n_gpus=2, gpm=True, nvlink_links=4)
    source = install(fake)
    link_values(fake, 0, 1_000_000, {link: (1_000, 2_000) for link in range(4)})
    source.refresh_slow_metrics()
    assert not source.sample(1).nvlink_samples  # one reading per link: no rate yet
    link_values(fake, 0, 3_000_000, {link: (1_000 + 1_000 * (link + 1), 2_000 + 500) for link in range(4)})
    source.refresh_slow_metrics()
    got = per_link(source.sample(2))
    assert set(got) == {("GPU-fake-0", link) for link in range(4)}  # GPU 1's counters never moved: no rate
    for link in range(4):  # +1000 (link + 1) KiB and +500 KiB in 2 s
        assert got[("GPU-fake-0", link)] == (pytest.approx(500 * 1024 * (link + 1)), pytest.approx(250 * 1024))
    assert not source.sample(3).nvlink_samples  # handed to one tick only, not repeated until the next refresh
    assert fake.count("nvmlDeviceGetFieldValues", 0) == 2  # one call per refresh, all links at once
    assert fake.count("nvmlDeviceGetPcieThroughput", 0) == 0  # GPM covers PCIe; the thread reads links only


def test_a_reset_link_reads_none_and_an_unsupported_value_is_left_out_for_good(install):
    fake = fk.FakeNvml(n_gpus=1, gpm=True, nvlink_links=2)
    source = install(fake)
    link_values(fake, 0, 1_000_000, {0: (5_000, 5_000), 1: (5_000, 5_000)})
    source.refresh_slow_metrics()
    link_values(fake, 0, 2_000_000, {0: (10, 6_000), 1: (6_000, 6_000)})  # link 0 tx went backwards: a reset
    source.refresh_slow_metrics()
    got = per_link(source.sample(1))
    assert got[("GPU-fake-0", 0)] == (None, pytest.approx(1000 * 1024))
    assert got[("GPU-fake-0", 1)] == (pytest.approx(1000 * 1024), pytest.approx(1000 * 1024))

    fake.link_values[0][(TX, 1)] = (7_000, 3_000_000, fk.NOT_SUPPORTED)
    source.refresh_slow_metrics()
    assert (0, "nvlink_link1_tx") in source.unsupported()
    source.refresh_slow_metrics()
    asked = fake.count("nvmlDeviceGetFieldValues", 0)
    source.refresh_slow_metrics()
    assert fake.count("nvmlDeviceGetFieldValues", 0) == asked + 1
    assert (TX, 1) not in fake.last_field_ids[0] and (RX, 1) in fake.last_field_ids[0]


def test_a_gpu_without_nvlink_has_no_per_link_readings_and_no_per_link_call(install):
    for gpm in (False, True):
        fake = fk.FakeNvml(n_gpus=1, gpm=gpm, nvlink_links=0)
        source = install(fake)
        for tick in range(3):
            source.refresh_slow_metrics()
            assert source.sample(tick).nvlink_samples == []
        assert fake.count("nvmlDeviceGetFieldValues", 0) == 0
        source.close()


def test_the_slow_thread_runs_for_per_link_nvlink_even_with_gpm(install):
    with_links = install(fk.FakeNvml(n_gpus=1, gpm=True, nvlink_links=2), slow_refresh_s=60.0)
    assert with_links._slow._thread is not None and with_links._slow._thread.is_alive()
    without = install(fk.FakeNvml(n_gpus=1, gpm=True, nvlink_links=0), slow_refresh_s=60.0)
    assert without._slow._thread is None
    with_links.close()
    assert not with_links._slow._thread.is_alive()
