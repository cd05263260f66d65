"""The sampler ticks on a fixed grid, survives a failing source and a bad sample, and skips rather than bursts."""

import math
import threading
import time

import pytest

from trimtab.contract.readings import EVENT_SOURCE_ERROR, GpuInfo, GpuSample, HostSample, NvlinkSample, Readings
from trimtab.agent.sampler import Sampler
from trimtab.agent.source import Inventory


class ScriptedSource:
    """A minimal Source for the loop's own behaviour: returns what the test scripts, or raises."""

    kind = "scripted"

    def __init__(self, n_gpus=2, fail_on=(), delay_s=0.0, value=50.0):
        self.n = n_gpus
        self.fail_on = set(fail_on)
        self.delay_s = delay_s
        self.value = value
        self.calls = 0

    def inventory(self):
        return Inventory(gpus=[GpuInfo(uuid=f"GPU-{i}", index=i, name="x") for i in range(self.n)])

    def sample(self, ts_ms):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("driver hiccup")
        if self.delay_s:
            time.sleep(self.delay_s)
        return Readings(gpu_samples=[GpuSample(gpu_uuid=f"GPU-{i}", ts_ms=ts_ms, util_pct=self.value) for i in range(self.n)],
                        host_sample=HostSample(ts_ms=ts_ms, cpu_pct=self.value))

    def close(self):
        pass


@pytest.mark.serial  # a wall-clock bound: under xdist it runs after the other tests, alone
def test_ticks_stay_on_the_grid_without_drift():
    stamps = []
    s = Sampler([ScriptedSource()], lambda b: stamps.append(time.monotonic()), interval_s=0.05, hostname="n")
    t0 = time.monotonic()
    s.run(threading.Event(), duration_s=1.0)
    assert len(stamps) == 20
    # The k-th tick fires at t0 + k*interval: the error does not accumulate over the run.
    late = [stamps[k] - (t0 + k * 0.05) for k in range(len(stamps))]
    assert max(late) < 0.04, late
    assert abs(late[-1] - late[1]) < 0.04


def test_a_failing_source_is_an_event_and_the_others_keep_sampling():
    good, bad = ScriptedSource(n_gpus=1), ScriptedSource(n_gpus=1, fail_on={1, 2, 3})
    bad.inventory = lambda: Inventory(gpus=[GpuInfo(uuid="GPU-b", index=1, name="y")])
    batches = []
    s = Sampler([good, bad], batches.append, interval_s=0.01, hostname="n")
    for _ in range(4):
        s.tick()
    assert [len(b.gpu_samples) for b in batches] == [1, 1, 1, 2]
    events = [e for b in batches for e in b.events if e.kind == EVENT_SOURCE_ERROR]
    assert len(events) == 1, "the same failure is recorded once, then counted"
    assert s.stats.source_errors == 3


def test_not_finite_values_become_none():
    src = ScriptedSource(value=math.nan)
    b = Sampler([src], lambda b: None, hostname="n").tick()
    assert all(g.util_pct is None for g in b.gpu_samples)
    assert b.host_samples[0].cpu_pct is None


@pytest.mark.serial  # a wall-clock bound: under xdist it runs after the other tests, alone
def test_an_overrunning_tick_skips_missed_ticks_instead_of_bursting():
    src = ScriptedSource(delay_s=0.25)
    s = Sampler([src], lambda b: None, interval_s=0.1, hostname="n")
    s.run(threading.Event(), duration_s=1.0)
    assert src.calls <= 5
    assert s.stats.ticks_skipped >= 4


def test_timestamps_are_strictly_increasing_even_if_the_clock_stalls():
    s = Sampler([ScriptedSource()], lambda b: None, hostname="n", clock_ms=lambda: 1000)
    stamps = [s.tick().gpu_samples[0].ts_ms for _ in range(3)]
    assert stamps == [1000, 1001, 1002]


def test_a_simulated_inventory_names_the_node_as_simulated():
    src = ScriptedSource()
    src.inventory = lambda: Inventory(gpus=[], simulated=True, scenario="actor-hot")
    s = Sampler([src], lambda b: None)
    assert s.node.simulated and s.node.hostname.endswith("-sim") and s.node.scenario == "actor-hot"


def test_per_link_readings_reach_the_batch_and_bad_values_become_none():
    class Links:
        kind = "nvml"

        def inventory(self):
            return Inventory()

        def sample(self, ts_ms):
            return Readings(nvlink_samples=[NvlinkSample("GPU-0", ts_ms, 0, tx_bytes_per_s=math.inf, rx_bytes_per_s=2.0)])

        def close(self):
            pass

    b = Sampler([Links()], lambda b: None, hostname="n").tick()
    assert [(n.link, n.tx_bytes_per_s, n.rx_bytes_per_s) for n in b.nvlink_samples] == [(0, None, 2.0)]
