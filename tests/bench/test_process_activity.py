"""bench/process_activity.py's estimators of a process's busy time, on CPU with a synthetic two-process GPU whose
truth is known (the script itself needs a GPU): the agent's ``mean × samples × period``, the share of summed smUtil
× the device's utilization × the interval, and each sample's smUtil × the time since the previous one — and its
report of them against each process's own total, with the raw numbers."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from bench.process_activity import report, share_times_util, sm_times_dt

PERIOD_US = 200_000  # NVML's sampling period on the H100 (0.201 s measured)


def schedule(seconds: int = 10):
    """Generation busy 0.6 s then reward 0.4 s of every second, back to back; the driver samples every 0.2 s and
    gives each sample to the process that ran in it at 100 % SM. Returns raw samples, ticks (1 s, 100 % util),
    and each process's bursts (wall start, end, busy s)."""
    raw, bursts = [], {"generation": [], "reward": []}
    for s in range(seconds):
        bursts["generation"].append((s, s + 0.6, 0.6))
        bursts["reward"].append((s + 0.6, s + 1.0, 0.4))
        for k in range(5):
            raw.append((1 if k < 3 else 2, (s * 5 + k + 1) * PERIOD_US, 100, 10))
    ticks = [(0.0, 100, 100.0, [])] + [(float(s + 1), 100, 100.0, [r for r in raw if s * 1e6 < r[1] <= (s + 1) * 1e6])
                                        for s in range(seconds)]
    return raw, ticks, bursts


def test_share_times_util_and_sm_times_dt_recover_a_back_to_back_schedule():
    raw, ticks, _ = schedule()
    busy, span = share_times_util(ticks, use_mean=False)
    assert span == (0.0, 10.0) and busy == {1: pytest.approx(6.0), 2: pytest.approx(4.0)}
    busy, span = sm_times_dt(raw, per_process=False)
    # the first sample has no previous one: 0.2 s of generation is not counted
    assert busy == {1: pytest.approx(5.8), 2: pytest.approx(4.0)} and span == (0.2, 10.0)
    busy, _ = sm_times_dt(raw, per_process=True)  # a process's previous sample: its gap spans the other's turn
    assert busy[2] == pytest.approx(4.0 - 0.2 + 9 * 0.6)  # its first sample uncounted, then 9 gaps of 0.6 s


def test_the_report_prints_every_estimator_against_each_processs_own_total(capsys):
    raw, ticks, bursts = schedule()
    rows = [SimpleNamespace(pid=pid, util_samples=sum(1 for r in raw if r[0] == pid), sm_util_pct=100.0,
                            util_from_ms=0, util_to_ms=10_000, used_memory_bytes=(4 if pid == 1 else 2) << 30)
            for pid in (1, 2)]
    activity = SimpleNamespace(function_name="nvmlDeviceGetProcessesUtilizationInfo")
    source = SimpleNamespace(tick_calls=lambda: [(SimpleNamespace(activity=activity), [])],
                             activity_failed_calls=lambda: 0)
    own = {"generation": (1, bursts["generation"]), "reward": (2, bursts["reward"])}
    code = report(argparse.Namespace(gpu=0, json=False), own, rows, raw, [5] * 10, ticks, source)
    out = capsys.readouterr().out
    assert code == 0  # (a): 30 samples × 100 % × 0.2 s = 6 s of 6 s, 4 of 4
    assert "samples per call median 5.0, max 5" in out and "NVML sampling period 0.200 s" in out
    assert "device utilization over 11 ticks: mean of nvmlDeviceGetUtilizationRates readings 100.0 %" in out
    for name in ("b_share_x_util", "b2_share_x_util_samples", "c_sm_x_dt_gpu", "c2_sm_x_dt_process"):
        assert name in out
    assert "estimators within it: b_share_x_util, b2_share_x_util_samples, c_sm_x_dt_gpu\n" in out
