"""The host source reads real psutil figures in sane ranges; rates need two calls."""

from __future__ import annotations

import time

import psutil

from trimtab.agent.host import HostSource
from trimtab.agent.source import Source

RATES = ("cpu_pct", "net_rx_bytes_per_s", "net_tx_bytes_per_s", "disk_read_bytes_per_s", "disk_write_bytes_per_s")


def test_it_is_a_source_with_no_gpus():
    source = HostSource()
    assert isinstance(source, Source) and source.kind == "host"
    assert source.inventory().gpus == [] and not source.inventory().simulated


def test_first_call_has_no_rates_the_second_has_numbers():
    source = HostSource()
    first = source.sample(1_000).host_sample
    assert all(getattr(first, name) is None for name in RATES)
    sum(i * i for i in range(200_000))  # a little CPU work, a little time
    time.sleep(0.05)
    second = source.sample(2_000).host_sample
    assert second.ts_ms == 2_000
    assert 0.0 <= second.cpu_pct <= 100.0
    assert second.net_rx_bytes_per_s >= 0 and second.net_tx_bytes_per_s >= 0
    if psutil.disk_io_counters() is not None:
        assert second.disk_read_bytes_per_s >= 0 and second.disk_write_bytes_per_s >= 0


def test_memory_and_load_are_sane():
    s = HostSource().sample(0).host_sample
    assert 0 < s.mem_used_bytes < s.mem_total_bytes
    assert s.mem_total_bytes == psutil.virtual_memory().total
    assert s.load1 >= 0.0


def test_a_counter_that_goes_back_reads_none_not_negative(monkeypatch):
    from types import SimpleNamespace as NS

    readings = iter([{"eth0": NS(bytes_recv=5_000, bytes_sent=100), "lo": NS(bytes_recv=9, bytes_sent=9)},
                     {"eth0": NS(bytes_recv=1_000, bytes_sent=300), "lo": NS(bytes_recv=10**12, bytes_sent=9)}])
    monkeypatch.setattr(psutil, "net_io_counters", lambda pernic=False: next(readings))
    source = HostSource()
    source.sample(0)
    time.sleep(0.01)
    s = source.sample(1).host_sample
    assert s.net_rx_bytes_per_s is None  # eth0 was reset (or a NIC vanished); loopback is not counted
    assert s.net_tx_bytes_per_s > 0
