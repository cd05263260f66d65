"""bench/process_activity.py's estimators of a process's busy time, on CPU with a synthetic two-process GPU whose
truth is known (the script itself needs a GPU): the agent's (each row's mean SM % × the seconds it covers, through
the ledger's estimator), the share of summed smUtil × the device's utilization × the interval, and each record's
smUtil × the time since the previous one — and its report of them against each process's own total over the span
each covers, with the raw numbers."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from bench.process_activity import agent_attribution, report
from bench.process_estimators import driver_rule, share_times_util, sm_times_dt

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


def agent_rows(seconds: int = 10, first_from_ms: int = 0):
    """The agent's process rows for the schedule: one a second, each pid's mean SM % over the second it covers
    (generation 60 %, reward 40 %); the first covers from ``first_from_ms`` (the baseline read, maybe before the first
    burst), and a baseline row before it is unknown."""
    rows = [SimpleNamespace(pid=pid, util_samples=None, sm_util_pct=None, util_from_ms=None, util_to_ms=None,
                            used_memory_bytes=0) for pid in (1, 2)]
    for s in range(seconds):
        start = first_from_ms if s == 0 else s * 1000
        for pid, busy_s in ((1, 0.6), (2, 0.4)):
            covered_s = ((s + 1) * 1000 - start) / 1000
            rows.append(SimpleNamespace(pid=pid, util_samples=1, sm_util_pct=100 * busy_s / covered_s,
                                        util_from_ms=start, util_to_ms=(s + 1) * 1000,
                                        used_memory_bytes=(4 if pid == 1 else 2) << 30))
    return rows


def test_the_drivers_rule_credits_each_sample_whole_to_the_process_that_ran_last():
    """Generation 0–0.3 s, reward 0.3–0.5 s back to back, then idle; samples every 0.2 s. The sample ending at 0.4 s
    holds 0.1 s of each and goes whole to the reward (running at its instant); the one ending at 0.6 s (50 %: the
    reward's last 0.1 s) to the reward too, the last to run."""
    reads = [{"util_samples": [(0, 0), (200_000, 100)]}, {"util_samples": [(400_000, 100), (600_000, 50)]}]
    got, span = driver_rule(reads, {1: [(0.0, 0.3, 0.3)], 2: [(0.3, 0.5, 0.2)]})
    assert span == (0.0, 0.6)
    assert got[1] == pytest.approx(0.2) and got[2] == pytest.approx(0.3)  # truth 0.3 and 0.2: the tail moved
    assert driver_rule([{"util_samples": [(0, 0)]}], {1: []}) == ({}, None)


def test_the_agents_attribution_is_sm_times_covered_seconds_through_the_ledgers_estimator():
    got = agent_attribution(agent_rows(first_from_ms=-2000))
    assert got[1]["busy_s"] == pytest.approx(6.0) and got[2]["busy_s"] == pytest.approx(4.0)
    assert got[1]["covered_s"] == pytest.approx(12.0) and got[1]["records"] == 10
    assert got[1]["intervals_ms"][0] == (-2000, 1000)  # the unknown baseline row is left out


def test_the_report_prints_every_estimator_against_each_processs_own_total(capsys):
    raw, ticks, bursts = schedule()
    # the first row covers 2 s before the first burst: the truth is over exactly that span too (nothing added)
    rows = agent_rows(first_from_ms=-2000)
    activity = SimpleNamespace(function_name="nvmlDeviceGetProcessUtilization (one C call)",
                               pick_costs_s={"nvmlDeviceGetProcessUtilization (one C call)": 0.0012})
    source = SimpleNamespace(tick_calls=lambda: [(SimpleNamespace(activity=activity), [])],
                             activity_failed_calls=lambda: 0)
    own = {"generation": (1, bursts["generation"]), "reward": (2, bursts["reward"])}
    args = argparse.Namespace(gpu=0, json=False, activity_every=1.0, idle_s=0.0)
    code = report(args, own, rows, raw, [5] * 10, ticks, source)
    out = capsys.readouterr().out
    assert code == 0  # (a): 6 s of 6 s, 4 of 4
    assert "raw records per call median 5.0, max 5" in out and "NVML sampling period 0.200 s" in out
    assert "with nvmlDeviceGetProcessUtilization (one C call) every 1.0 s, off the tick" in out
    assert "its rows cover 12.0 s" in out and "1.200 ms" in out
    assert "device utilization over 11 ticks: mean of nvmlDeviceGetUtilizationRates readings 100.0 %" in out
    for name in ("b_share_x_util", "b2_share_x_util_samples", "c_sm_x_dt_gpu", "c2_sm_x_dt_process"):
        assert name in out
    assert "other estimators within it: b_share_x_util, b2_share_x_util_samples, c_sm_x_dt_gpu\n" in out


def test_the_report_says_not_within_when_the_agent_is_off_by_more_than_5_percent(capsys):
    raw, ticks, bursts = schedule()
    rows = agent_rows()
    for r in rows:
        if r.pid == 2 and r.sm_util_pct is not None:
            r.sm_util_pct *= 0.9  # the reward's records read 10 % low
    activity = SimpleNamespace(function_name="x", pick_costs_s={})
    source = SimpleNamespace(tick_calls=lambda: [(SimpleNamespace(activity=activity), [])],
                             activity_failed_calls=lambda: 0)
    own = {"generation": (1, bursts["generation"]), "reward": (2, bursts["reward"])}
    code = report(argparse.Namespace(gpu=0, json=False, activity_every=1.0, idle_s=0.0), own, rows, raw, [5] * 10,
                  ticks, source)
    assert code == 1 and "attribution NOT within 5%" in capsys.readouterr().out


def test_without_a_cuda_gpu_it_exits_2_with_one_line():
    import subprocess
    import sys
    from pathlib import Path

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the no-GPU path is not taken")
    proc = subprocess.run([sys.executable, "bench/process_activity.py", "--seconds", "1"],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "needs a CUDA GPU" in proc.stderr
