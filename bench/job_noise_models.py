"""Synthetic jobs whose host moves under them (issues 15, 20 and 38): step noise of ±10–20 %, a warm-up, a host
that slows or shifts between regimes by itself, stalls, a slowdown that lands with a move. A change's verdict must
not read the host's doing as the change's.
"""

from __future__ import annotations

import math

from bench.job_curve_models import eval_bound, non_monotone
from bench.synthetic_job import STEPS, Workload, noisy_s


def noisy() -> Workload:
    w = eval_bound(0.2, STEPS // 2)
    w.moved_at = STEPS // 2
    return w


def warm_up() -> Workload:
    """A knob that does nothing (prefetch on a job with nothing to overlap), generation-bound, and a warm-up: the
    first steps take up to twice as long (×(1 + e^(−step/10))). Every setting is the best; any gain kept is
    warm-up credited to a change."""
    def step(k, i, rng):
        t = noisy_s(rng, 0.3 * (1.0 + math.exp(-i / 10.0)), 0.05)
        return t, {"generation": 0.7 * t, "update": 0.3 * t}, 8
    return Workload("knob that does nothing, warm-up", {"prefetch": {"value": 0, "min": 0, "max": 8}}, step,
                    [{"prefetch": p} for p in (0, 2, 4, 8)], steps=160)


def drifting_host() -> Workload:
    """The H200 pipeline's trap on a CPU: a weight sync whose reported time (0.45 s, ~40 % of the step) is mostly
    hidden behind prefetched generation — 0.1 s of it is on the step's path (0.6 s of compute, ±8 %), so sync 1 → 4
    pays +11 % and 4 → 8 +2 % — on a host that slows by itself: a neighbour arrives at step 12 and the steps are
    15 % slower by step 20 (one static setting on the H200 read 88.9, then 73.8 samples/s within one run). A
    verdict whose windows straddle the slowdown reads the host's slowdown as the change's."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        slow = 1.0 + 0.15 * min(1.0, max(0.0, (i - 12) / 8))
        synced = (i + 1) % sync == 0
        compute = noisy_s(rng, 0.6, 0.08) * slow
        t = compute + (0.1 * slow if synced else 0.0)
        return t, {"generation": compute - 0.05 * slow, "update": 0.05 * slow,
                   **({"communication": 0.45 * slow} if synced else {})}, 16
    return Workload("drifting host (sync, 15 % slower from step 12)",
                    {"sync_every": {"value": 1, "min": 1, "max": 8}}, step, [{"sync_every": s} for s in (1, 2, 4, 8)],
                    steps=160, moved_at=12)


def regime_host() -> Workload:
    """The H200 host's other habit: its speed shifts between regimes (steps 20 % slower for a while, ~8 steps on
    average, then back) while the job stands still — on the H200 one fixed setting read 70–90 samples/s in runs of
    3–20 steps. The job: prefetch that pays (0.45 s generation, 0.35 s scoring hidden at prefetch 2: +30 %), ±5 %
    step noise. A before window that ends in a fast regime looks like a climb (a warm-up still settling)."""
    regime = {"slow": False}

    def step(k, i, rng):
        if rng.random() < 0.12:
            regime["slow"] = not regime["slow"]
        slow = 1.2 if regime["slow"] else 1.0
        p = int(k["prefetch"])
        hidden = 0.35 * min(1.0, p / 2)
        gen, ev = 0.45 * slow, (0.35 - hidden) * slow
        t = noisy_s(rng, gen + ev + 0.01 * max(0, p - 2), 0.05)
        return t, {"generation": t * gen / (gen + ev), "evaluation": t * ev / (gen + ev)}, 8
    return Workload("regime-shifting host (prefetch, ±20 % regimes)", {"prefetch": {"value": 0, "min": 0, "max": 8}},
                    step, [{"prefetch": p} for p in (0, 1, 2, 4, 8)], steps=160)


def stalls() -> Workload:
    """A job that stalls now and then whatever its setting — a checkpoint or validation pass inside a step, a GC
    pause, a host hiccup (on the H200, run 15, a benchmark's own refill step: 10.3 s among 0.9 s ones, inside a
    verdict's window): the drifting host's sync job without the drift (0.6 s of compute, ±8 %, 0.1 s of each sync on
    the step's path: sync 1 → 4 pays +11 %, 4 → 8 +2 %), one step in 30 taking 10× as long."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        synced = (i + 1) % sync == 0
        compute = noisy_s(rng, 0.6, 0.08)
        stall = 5.4 if rng.random() < 1 / 30 else 0.0
        t = compute + stall + (0.1 if synced else 0.0)
        return t, {"generation": compute - 0.05 + stall, "update": 0.05,
                   **({"communication": 0.45} if synced else {})}, 16
    return Workload("stalls (sync, one step in 30 10× long)", {"sync_every": {"value": 1, "min": 1, "max": 8}}, step,
                    [{"sync_every": s} for s in (1, 2, 4, 8)], steps=160)


def comm_bound_noisy() -> Workload:
    """The two-rank communication-bound job as users run it: 0.25 s of compute at ±20 % a step, a 0.5 s all-reduce
    every sync_every steps (at sync 8 communication is ~20 % of the step; 8 → 16 pays +11 %, 16 → 32 +6 %): one
    rung read as flat must not end the ladder while the rule still fires. Best at the max, 32."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        comm = 0.5 if (i + 1) % sync == 0 else 0.0
        t = noisy_s(rng, 0.25, 0.2) + comm
        return t, {"generation": t - comm - 0.05, "update": 0.05, **({"communication": comm} if comm else {})}, 16
    return Workload("communication-bound, noisy ±20 % (2 ranks)", {"sync_every": {"value": 1, "min": 1, "max": 32}},
                    step, [{"sync_every": s} for s in (1, 2, 4, 8, 16, 32)], ranks=2, steps=160)


def non_monotone_noisy() -> Workload:
    """The non-monotone batch curve (peak 24, falling past 32) at ±10 % step noise from batch 4: its best must be
    tried although a rung on the way reads flat."""
    w = non_monotone()

    def step(k, i, rng):
        t, _, b = w.step(k, i, rng)
        t = noisy_s(rng, t, 0.1)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("non-monotone batch curve, noisy ±10 %", {"batch_size": {"value": 4, "min": 1, "max": 128}},
                    step, w.grid, steps=160)


def slowdown_at_a_move() -> Workload:
    """The evaluation-bound prefetch job (prefetch 0 → 4 pays +43 %, ±3 %) on a host that slows ×1.3 for good at
    the step the job's first move lands (the worst moment: the move's after window is all slow, its before window
    all fast) — the slowdown is the host's, not the move's: the move must not be charged with it."""
    base = eval_bound()
    seen = {"start": None, "slow_from": None, "i": -1}
    made: list[Workload] = []

    def step(k, i, rng):
        if i <= seen["i"]:  # a new run or static measurement
            seen["start"], seen["slow_from"] = None, None
        seen["i"] = i
        if seen["start"] is None:
            seen["start"] = dict(k)
        elif seen["slow_from"] is None and dict(k) != seen["start"]:
            seen["slow_from"] = made[0].moved_at = i  # the job moved: a value measured worse before may be retried
        t, phases, n = base.step(k, i, rng)
        slow = 1.3 if seen["slow_from"] is not None else 1.0
        return t * slow, {p: v * slow for p, v in phases.items()}, n
    made.append(Workload("host slows ×1.3 as the first move lands (prefetch)", base.knobs, step, base.grid,
                         steps=160))
    return made[0]
