"""The estimators ``bench/process_activity.py`` sets against each process's own CUDA-event busy time: what a reader of
NVML's per-process records could credit each process with, and the truth over a span. Apart from the script (which
needs a GPU) so they are tested on the CPU with synthetic records (``tests/bench/test_process_activity.py``)."""

from __future__ import annotations

from typing import Optional


def own_busy_s(bursts: list, from_s: float, to_s: float) -> float:
    """Busy seconds of the bursts inside (from_s, to_s], a burst cut by an edge counted pro rata of its wall time."""
    total = 0.0
    for w0, w1, busy in bursts:
        inside = max(0.0, min(w1, to_s) - max(w0, from_s))
        total += busy * inside / (w1 - w0) if w1 > w0 else 0.0
    return total


def share_times_util(ticks: list, use_mean: bool) -> tuple[dict, Optional[tuple]]:
    """Estimator (b): per tick interval, each pid's share of the summed smUtil × the device's utilization × the
    interval's wall time. Returns pid → busy seconds and the (from_s, to_s) span covered."""
    out: dict[int, float] = {}
    for (t0, *_), (t1, now, mean, got) in zip(ticks, ticks[1:]):
        util = mean if use_mean else now
        total = sum(g[2] for g in got)
        if util is None or total <= 0:
            continue
        for pid, _, sm, _ in got:
            out[pid] = out.get(pid, 0.0) + sm / total * util / 100 * (t1 - t0)
    return out, (ticks[0][0], ticks[-1][0]) if len(ticks) > 1 else None


def sm_times_dt(raw: list, per_process: bool) -> tuple[dict, Optional[tuple]]:
    """Estimator (c): each sample's smUtil × the time since the previous sample's timestamp (on the GPU: any
    process's; ``per_process``: the same process's). Returns pid → busy seconds and the span (s) covered."""
    out: dict[int, float] = {}
    ordered = sorted(raw, key=lambda r: r[1])
    if len(ordered) < 2:
        return out, None
    previous: dict = {}
    for pid, stamp, sm, _ in ordered:
        key = pid if per_process else None
        if key in previous and stamp > previous[key]:
            out[pid] = out.get(pid, 0.0) + sm / 100 * (stamp - previous[key]) / 1e6
        previous[key] = stamp
    return out, (ordered[0][1] / 1e6, ordered[-1][1] / 1e6)


def driver_rule(reads: list, bursts_by_pid: dict[int, list]) -> tuple[dict, Optional[tuple]]:
    """Estimator (d), the driver's own rule applied to the truth: the best any reader of NVML's per-process records
    can do. Measured on the H100 (driver 580.159.04, reads at the 200 ms sampling period: 203 of 204 records): each
    per-process record's smUtil is the device's utilization sample, credited whole to the process that ran last
    before the sample's instant, and a record read over several samples is the sum of those it won over their count.
    So per device sample (t_prev, t]: its utilization × its length to the process whose bursts ended (or run) latest
    at t. Where processes take turns faster than the sampling period, the newcomer of each back-to-back turn is
    credited the other's tail; the error falls as turns lengthen. Returns pid → busy seconds and the span (s)."""
    samples = sorted({(t, v) for read in reads for t, v in read.get("util_samples", ())})
    out: dict[int, float] = {}
    if len(samples) < 2:
        return out, None

    def last_active_s(pid: int, at_s: float) -> float:
        return max([min(w1, at_s) for w0, w1, _ in bursts_by_pid[pid] if w0 <= at_s], default=float("-inf"))

    for (t0, _), (t1, value) in zip(samples, samples[1:]):
        at_s = t1 / 1e6
        winner = max(bursts_by_pid, key=lambda pid: last_active_s(pid, at_s))
        if last_active_s(winner, at_s) > float("-inf"):
            out[winner] = out.get(winner, 0.0) + value / 100 * (t1 - t0) / 1e6
    return out, (samples[0][0] / 1e6, samples[-1][0] / 1e6)
