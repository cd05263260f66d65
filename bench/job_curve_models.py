"""Synthetic jobs whose knob's curve is the point (issues 15 and 20): the best setting at a knob's max, at a peak
past which throughput falls, behind rungs that gain too little to measure, or nowhere (steps of 5–12 ms); step
noise steady at ±3–10 %. The noisy and drifting variants are ``bench/job_noise_models.py``.
"""

from __future__ import annotations

import math
from typing import Optional

from bench.synthetic_job import Workload, batch_time_s, noisy_s


def comm_bound() -> Workload:
    """2 ranks, 0.25 s of compute a step and a 0.6 s all-reduce every sync_every steps: best at the max, 32."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        comm = 0.6 if (i + 1) % sync == 0 else 0.0
        t = noisy_s(rng, 0.25, 0.03) + comm
        return t, {"generation": t - comm - 0.05, "update": 0.05, **({"communication": comm} if comm else {})}, 16
    return Workload("communication-bound (2 ranks)", {"sync_every": {"value": 1, "min": 1, "max": 32}}, step,
                    [{"sync_every": s} for s in (1, 2, 4, 8, 16, 32)], ranks=2)


def eval_bound(noise: float = 0.03, slowdown_at: Optional[int] = None) -> Workload:
    """0.3 s generation, 0.7 s serial scoring that prefetch overlaps (fully at 4; beyond, 10 ms a step each)."""
    def step(k, i, rng):
        p = int(k["prefetch"])
        gen, ev = 0.3, 0.7
        hidden = min(gen, ev) * min(1.0, p / 4)  # prefetch overlaps scoring with the next generation
        slow = 1.3 if slowdown_at is not None and i >= slowdown_at else 1.0
        t = noisy_s(rng, (gen + ev - hidden + 0.01 * max(0, p - 4)) * slow, noise)
        exposed_ev = (ev - hidden) * slow
        return t, {"generation": max(0.0, t - exposed_ev - 0.01), "evaluation": exposed_ev}, 8
    name = "evaluation-bound, prefetch" if slowdown_at is None else "noisy ±20 %, 30 % slowdown halfway"
    return Workload(name, {"prefetch": {"value": 0, "min": 0, "max": 8}}, step,
                    [{"prefetch": p} for p in (0, 1, 2, 3, 4, 6, 8)])


def non_monotone() -> Workload:
    """Samples/s rising with the batch to a peak at 24, falling after 32 (a cache that stops fitting)."""
    def rate(b):
        top = 24 / batch_time_s(24)
        if b <= 24:
            return b / batch_time_s(b)
        return top * max(0.2, 1 - 0.005 * (min(b, 32) - 24) - 0.015 * max(0, b - 32))

    def step(k, i, rng):
        b = int(k["batch_size"])
        t = noisy_s(rng, b / rate(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("non-monotone batch curve", {"batch_size": {"value": 1, "min": 1, "max": 128}}, step,
                    [{"batch_size": b} for b in (1, 4, 8, 16, 20, 24, 28, 32, 48, 64)])


def fast_steps() -> Workload:
    """5–12 ms steps (4 ms fixed + 0.12 ms a sample, ±10 % noise), generation-bound: batch 4 → 64 (the job's
    max) pays 6× — a 4 s window would be 400–800 steps, so a window of these steps is counted in steps."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = noisy_s(rng, 0.004 + 0.00012 * b, 0.10)
        return t, {"generation": 0.8 * t, "update": 0.2 * t}, b
    return Workload("fast steps (5–12 ms)", {"batch_size": {"value": 4, "min": 1, "max": 64}}, step,
                    [{"batch_size": b} for b in (4, 8, 16, 32, 64)])


def _hump(b: float) -> float:
    """Throughput relative to the best (batch 16), piecewise linear in log2(batch): a KV cache that stops fitting
    past 16 (32: −8 %, 64: −34 %, 128: −60 %)."""
    points = [(0, 0.2), (2, 0.55), (3, 0.8), (4, 1.0), (5, 0.92), (6, 0.66), (7, 0.4)]
    x = math.log2(max(1.0, b))
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def known_loser() -> Workload:
    """A non-monotone batch curve with its peak at 16 and ±10 % step noise (noise alone moves a window's level
    now and then): 64 measures about −34 %, 32 about −8 %. A value measured worse must not be tried again."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = noisy_s(rng, b / (32.0 * _hump(b)), 0.10)
        return t, {"generation": 0.85 * t, "update": 0.15 * t}, b
    return Workload("non-monotone, peak 16, noisy", {"batch_size": {"value": 4, "min": 1, "max": 128}}, step,
                    [{"batch_size": b} for b in (4, 8, 12, 16, 20, 24, 32, 64)], steps=160)


def sync_ladder() -> Workload:
    """2 ranks, 0.2 s of compute a step and a sparse-delta weight sync every sync_every steps whose payload grows
    with the steps it carries until every row is touched (16 steps): 32 ms + 0.2 s a step carried, at most
    3.2 s. Up to 16 a longer interval only saves the 32 ms (4 → 16: +1.5 %, "no measurable gain") while the
    communication share stays near 50 %; past 16 the sync stops growing: 64 (the job's max) is best, 60 % above
    16."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        comm = 0.032 + 0.2 * min(sync, 16) if (i + 1) % sync == 0 else 0.0
        compute = noisy_s(rng, 0.2, 0.03)
        return compute + comm, {"generation": compute - 0.02, "update": 0.02,
                                **({"communication": comm} if comm else {})}, 16
    return Workload("sync ladder (2 ranks, best 64)", {"sync_every": {"value": 1, "min": 1, "max": 64}}, step,
                    [{"sync_every": s} for s in (1, 4, 8, 16, 32, 64)], ranks=2, steps=160)
