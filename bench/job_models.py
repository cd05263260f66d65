"""The synthetic jobs ``bench/workloads.py`` runs under the rebalancer: each a step model (setting, step, rng →
step time, phases, samples), its knobs, a grid of static settings to find its best, and how long it runs. Issue
15's five, issue 20's jobs unlike the ones the rebalancer was built on, and the lent H200 host's two habits (a
drift, regimes). Step times are simulated seconds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Optional

GIB = 2**30
GOAL_STEPS = 60          # within 5 % of the best by this step …
TAIL_STEPS = 32          # … and measured over the next 32 (a whole number of periods of sync 1 … 32)
STEPS = GOAL_STEPS + TAIL_STEPS
LIMIT_GIB = 141.0        # the simulated GPU's memory: a setting whose peak is above it OOMs


@dataclass
class Workload:
    name: str
    knobs: dict                                   # name → {value, min, max}
    step: Callable[[dict, int, random.Random], tuple[float, dict, int]]  # (setting, step, rng) → t, phases, samples
    grid: list[dict]                              # static settings to measure
    ranks: int = 1
    memory_gib: Optional[Callable[[dict], float]] = None  # the setting's peak; above LIMIT_GIB it OOMs
    steps: int = STEPS                            # how long the run is (the tail is steps GOAL_STEPS … steps − 1)
    moved_at: Optional[int] = None                # the step where the job itself moves (a slowdown): a value
                                                  # measured worse before it may be tried again after it
    report: Optional[Callable[[], dict]] = None   # more top-level fields of the report of the step just modelled
    neighbour: Optional[Callable[[int], "Neighbour"]] = None  # seed → another process's memory on the GPU; an OOM
                                                  # then halves the batch as the hook does (a lost step, 0 samples)


def learning_declaration(w: Workload) -> dict:
    """The rules override each simulated job registers with: every knob of it throughput-only. A job modelled here
    has step times and no policy — no knob of it changes what is learned, and it reports no learning signal — so it
    says so per knob, the way a real job declares a knob it knows changes only its speed (``[learning]
    throughput_only``). Without it the shipped rules (``without_signals = "advise"``) would only advise its
    prefetch and sync_every moves."""
    return {"learning": {"throughput_only": sorted(w.knobs)}}


def _noisy(rng: random.Random, t: float, noise: float) -> float:
    return t * (1 + rng.uniform(-noise, noise))


def comm_bound() -> Workload:
    """2 ranks, 0.25 s of compute a step and a 0.6 s all-reduce every sync_every steps: best at the max, 32."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        comm = 0.6 if (i + 1) % sync == 0 else 0.0
        t = _noisy(rng, 0.25, 0.03) + comm
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
        t = _noisy(rng, (gen + ev - hidden + 0.01 * max(0, p - 4)) * slow, noise)
        exposed_ev = (ev - hidden) * slow
        return t, {"generation": max(0.0, t - exposed_ev - 0.01), "evaluation": exposed_ev}, 8
    name = "evaluation-bound, prefetch" if slowdown_at is None else "noisy ±20 %, 30 % slowdown halfway"
    return Workload(name, {"prefetch": {"value": 0, "min": 0, "max": 8}}, step,
                    [{"prefetch": p} for p in (0, 1, 2, 3, 4, 6, 8)])


def _batch_time(b: float) -> float:
    return 0.3 + 0.03 * b


def non_monotone() -> Workload:
    """Samples/s rising with the batch to a peak at 24, falling after 32 (a cache that stops fitting)."""
    def rate(b):
        top = 24 / _batch_time(24)
        if b <= 24:
            return b / _batch_time(b)
        return top * max(0.2, 1 - 0.005 * (min(b, 32) - 24) - 0.015 * max(0, b - 32))

    def step(k, i, rng):
        b = int(k["batch_size"])
        t = _noisy(rng, b / rate(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("non-monotone batch curve", {"batch_size": {"value": 1, "min": 1, "max": 128}}, step,
                    [{"batch_size": b} for b in (1, 4, 8, 16, 20, 24, 28, 32, 48, 64)])


def memory_growing() -> Workload:
    """2 GiB + 3 GiB per sample on a 141 GiB GPU (46 fits); throughput rises with the batch all the way."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = _noisy(rng, _batch_time(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("memory-growing (3 GiB/sample, 141 GiB)", {"batch_size": {"value": 1, "min": 1, "max": 128}},
                    step, [{"batch_size": b} for b in (1, 4, 16, 32, 40, 46)],
                    memory_gib=lambda k: 2.0 + 3.0 * k["batch_size"])


def noisy() -> Workload:
    w = eval_bound(0.2, STEPS // 2)
    w.moved_at = STEPS // 2
    return w


# -- issue 20: jobs unlike the ones the rebalancer was built on -------------------------------------------------------

def fast_steps() -> Workload:
    """5–12 ms steps (4 ms fixed + 0.12 ms a sample, ±10 % noise), generation-bound: batch 4 → 64 (the job's
    max) pays 6× — a 4 s window would be 400–800 steps, so a window of these steps is counted in steps."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = _noisy(rng, 0.004 + 0.00012 * b, 0.10)
        return t, {"generation": 0.8 * t, "update": 0.2 * t}, b
    return Workload("fast steps (5–12 ms)", {"batch_size": {"value": 4, "min": 1, "max": 64}}, step,
                    [{"batch_size": b} for b in (4, 8, 16, 32, 64)])


def warm_up() -> Workload:
    """A knob that does nothing (prefetch on a job with nothing to overlap), generation-bound, and a warm-up: the
    first steps take up to twice as long (×(1 + e^(−step/10))). Every setting is the best; any gain kept is
    warm-up credited to a change."""
    def step(k, i, rng):
        t = _noisy(rng, 0.3 * (1.0 + math.exp(-i / 10.0)), 0.05)
        return t, {"generation": 0.7 * t, "update": 0.3 * t}, 8
    return Workload("knob that does nothing, warm-up", {"prefetch": {"value": 0, "min": 0, "max": 8}}, step,
                    [{"prefetch": p} for p in (0, 2, 4, 8)], steps=160)


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
        t = _noisy(rng, b / (32.0 * _hump(b)), 0.10)
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
        compute = _noisy(rng, 0.2, 0.03)
        return compute + comm, {"generation": compute - 0.02, "update": 0.02,
                                **({"communication": comm} if comm else {})}, 16
    return Workload("sync ladder (2 ranks, best 64)", {"sync_every": {"value": 1, "min": 1, "max": 64}}, step,
                    [{"sync_every": s} for s in (1, 4, 8, 16, 32, 64)], ranks=2, steps=160)


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
        compute = _noisy(rng, 0.6, 0.08) * slow
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
        t = _noisy(rng, gen + ev + 0.01 * max(0, p - 2), 0.05)
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
        compute = _noisy(rng, 0.6, 0.08)
        stall = 5.4 if rng.random() < 1 / 30 else 0.0
        t = compute + stall + (0.1 if synced else 0.0)
        return t, {"generation": compute - 0.05 + stall, "update": 0.05,
                   **({"communication": 0.45} if synced else {})}, 16
    return Workload("stalls (sync, one step in 30 10× long)", {"sync_every": {"value": 1, "min": 1, "max": 8}}, step,
                    [{"sync_every": s} for s in (1, 2, 4, 8)], steps=160)


def queue_then_sync(bank: bool = False, mark: bool = False) -> Workload:
    """Two knobs, as the H200 pipeline has them: 0.5 s of generation that prefetch overlaps with the 0.3 s update, and a
    weight sync that at prefetch ≥ 1 waits 0.25 s for the worker's generation in flight (at prefetch 0, 0.05 s):
    generation-bound at first (prefetch 0 → 2: +13 %), communication-bound after (sync 1 → 4: +33 %); each prefetch
    unit past 2 costs 20 ms; ±5 % noise. ``bank``: the H200's pattern (runs 17–20) modelled — after a raise of
    prefetch by n, 4n steps run 15 % faster while the worker's bank drains (the H200 showed ~7 steps 8–20 % fast
    after a raise of 2; a model of what was seen there, not evidence of it). Without it, the settle after a prefetch
    raise only delays the sync move. ``mark``: each step reports the queue's high-water mark, as the reference
    pipeline does since f471aeb: generation (0.5 s a batch) is slower than the update (0.3 s), so the trainer takes
    each batch as it is finished and the queue never holds more than one (on the H200 ``queue_max_depth`` read 1 at
    prefetch 2 and 4)."""
    seen = {"i": -1, "p": None, "drain_until": -1}

    def step(k, i, rng):
        p, sync = int(k["prefetch"]), int(k["sync_every"])
        if i <= seen["i"]:  # a new run or static measurement: no raise carried over
            seen["p"], seen["drain_until"] = None, -1
        if bank and seen["p"] is not None and p > seen["p"]:
            seen["drain_until"] = i + 4 * (p - seen["p"])
        seen["i"], seen["p"] = i, p
        synced = (i + 1) % sync == 0
        wait = (0.25 if p >= 1 else 0.05) if synced else 0.0
        compute = 0.5 + 0.02 * max(0, p - 2) if p >= 1 else 0.8
        t = _noisy(rng, compute + wait, 0.05) * (0.85 if i < seen["drain_until"] else 1.0)
        gen = t * 0.5 / (compute + wait)
        phases = {"generation": gen, "update": max(0.0, t - gen - wait)}
        return t, {**phases, **({"communication": wait} if wait else {})}, 16
    name = "prefetch then sync, " + ("a bank drains after a raise (H200 modelled)" if bank else "no bank") \
        + (", the queue's mark reported" if mark else "")
    knobs = {"prefetch": {"value": 0, "min": 0, "max": 8}, "sync_every": {"value": 1, "min": 1, "max": 8}}
    grid = [{"prefetch": p, "sync_every": s} for p in (0, 2, 4) for s in (1, 2, 4, 8)]
    return Workload(name, knobs, step, grid, steps=160,
                    report=(lambda: {"queue_high_water": min(seen["p"], 1)}) if mark else None)


class _BoundedQueue:
    """A generation worker ahead of the trainer through a queue of depth ``prefetch``, batch by batch: the worker
    starts a batch whenever it is free and fewer batches are made or in the making than the depth allows (one more
    while the trainer waits, as ``PrefetchQueue`` counts); the trainer takes one a step and trains ``train_s``
    (± 5 %). Each unit of depth past 2 slows generation 3 % (a deeper queue holds more of the rollout's memory; on
    the H200 64/4/4 read 86.5 and 102.9 % of 64/2/4)."""

    def __init__(self, generation_s: Callable[[random.Random], float], train_s: float):
        self.generation_s, self.train_s = generation_s, train_s
        self.last, self.now, self.free, self.made, self.mark = -1, 0.0, 0.0, [], 0

    def _start(self, begin: float, depth: int, rng: random.Random) -> None:
        g = self.generation_s(rng) * (1 + 0.03 * max(0, depth - 2))
        self.free = begin + g
        self.made.append((self.free, g))

    def step(self, k: dict, i: int, rng: random.Random) -> tuple[float, dict, int]:
        depth = int(k["prefetch"])
        if i <= self.last:  # a new run or static measurement
            self.now, self.free, self.made = 0.0, 0.0, []
        self.last, now = i, self.now
        waiting_before = sum(1 for done, _ in self.made if done <= now)
        if not self.made:
            self._start(max(self.free, now), depth, rng)
        taken = max(now, self.made[0][0])
        while len(self.made) < depth + 1 and max(self.free, now) < taken:  # ahead while the trainer waits
            self._start(max(self.free, now), depth, rng)
        _, g = self.made.pop(0)
        end = taken + _noisy(rng, self.train_s, 0.05)
        while len(self.made) < depth and max(self.free, taken) < end:  # … and while it trains
            self._start(max(self.free, taken), depth, rng)
        self.now = end
        # the high-water mark: finished batches nobody had claimed at the boundary it began at, or as it ends
        self.mark = max(waiting_before, sum(1 for done, _ in self.made if done <= end))
        wait = taken - now
        return end - now, {"generation": g, "update": end - taken, "wait": wait}, 16


def bounded_queue(bursty: bool = False) -> Workload:
    """Prefetch through a bounded queue, simulated (``_BoundedQueue``), reporting the queue's high-water mark as
    the reference pipeline does. Generation-bound: 0.5 s (± 5 %) of generation against 0.35 s of training — past
    prefetch 1 the queue never holds a finished batch, a deeper one only costs (best 1–2, 4 is 6 % slower).
    ``bursty``: generation with a long tail (lognormal, median 0.25 s, mean 0.34 s, σ 0.8: one batch in ten over
    0.7 s) against 0.3 s of training — the queue fills now and then, after a run of fast batches, and a deeper one
    absorbs little (2, 3 and 4 within 1 % of each other, 8 slower): the case the check must not hold back.
    Built after the rule it exercises (``control/queue_use.py``), to measure it; the rule has no threshold to fit."""
    if bursty:
        q = _BoundedQueue(lambda rng: 0.25 * math.exp(rng.gauss(0.0, 0.8)), 0.3)
    else:
        q = _BoundedQueue(lambda rng: _noisy(rng, 0.5, 0.05), 0.35)
    name = "bounded queue, " + ("bursty generation (fills now and then)" if bursty else
                                "generation-bound (never fills)")
    return Workload(name, {"prefetch": {"value": 0, "min": 0, "max": 8}}, q.step,
                    [{"prefetch": p} for p in (0, 1, 2, 4, 8)], steps=160,
                    report=lambda: {"queue_high_water": q.mark})


WORKLOADS = {"comm": comm_bound, "eval": eval_bound, "non_monotone": non_monotone, "memory": memory_growing,
             "noisy": noisy, "fast": fast_steps, "warm_up": warm_up, "known_loser": known_loser,
             "ladder": sync_ladder, "drift": drifting_host, "regimes": regime_host, "stalls": stalls,
             "queue_sync": queue_then_sync, "queue_bank": lambda: queue_then_sync(bank=True),
             "queue_sync_mark": lambda: queue_then_sync(mark=True),
             "queue_steady": bounded_queue, "queue_bursty": lambda: bounded_queue(bursty=True)}


# -- issue 38: jobs that change over time (the drifting ones are scored by bench/drifting_jobs.py) -------------------

def periodic_heavy(every: int = 20, x: float = 10.0, phase: str = "validation") -> Workload:
    """A generation-bound batch job (0.15 s + 12.5 ms a sample, ±5 %: batch 4 → 64, the job's max, pays 3.4×) with a
    heavy step every ``every`` steps: a validation pass (or a checkpoint save) inside the step, ``x`` times the
    step at the starting batch, whatever the batch (``trainer.test_freq``, ``eval_steps``, ``save_steps``). The
    knob does nothing to the heavy step; a window at batch 4 (4 s: 20 steps) holds one, and half of it holds it."""
    extra_s = (x - 1.0) * (0.15 + 0.0125 * 4)

    def step(k, i, rng):
        b = int(k["batch_size"])
        train = _noisy(rng, 0.15 + 0.0125 * b, 0.05)
        heavy = extra_s if (i + 1) % every == 0 else 0.0
        phases = {"generation": 0.85 * train, "update": 0.15 * train, **({phase: heavy} if heavy else {})}
        return train + heavy, phases, b
    return Workload(f"periodic {phase} every {every} steps ({x:g}× a step)",
                    {"batch_size": {"value": 4, "min": 1, "max": 64}}, step,
                    [{"batch_size": b} for b in (4, 8, 16, 32, 64)], steps=160)


def generation_every(k: int = 4) -> Workload:
    """One generation step, then k − 1 training steps on what it made (TRL's ``steps_per_generation``): the step
    that generates takes 1.2 s + 40 ms a sample (decode) beside its training, each step trains 0.05 s + 6 ms a
    sample, all ±10 %; every step trains ``batch_size`` samples. Step times alternate one long, k − 1 short: a
    window that does not hold whole periods of k holds one generation more or less than its neighbour (at batch 4:
    1.66 s against 0.07 s). Generation is a phase the batch acts on — the job's work, not its schedule — so its
    steps stay in every window. Best at the max, 64 (samples/s rising 4.8× from batch 4)."""
    def step(kn, i, rng):
        b = int(kn["batch_size"])
        train = _noisy(rng, 0.05 + 0.006 * b, 0.1)
        gen = _noisy(rng, 1.2 + 0.04 * b, 0.1) if i % k == 0 else 0.0
        return gen + train, {"generation": gen, "update": train}, b
    return Workload(f"generation every {k} steps (TRL steps_per_generation)",
                    {"batch_size": {"value": 4, "min": 1, "max": 64}}, step,
                    [{"batch_size": b} for b in (4, 8, 16, 32, 64)], steps=160)


WORKLOADS.update({"eval_10x_20": periodic_heavy, "eval_5x_50": lambda: periodic_heavy(50, 5.0),
                  "checkpoint_25x_40": lambda: periodic_heavy(40, 25.0, "checkpoint"),
                  "generation_every_4": generation_every})


# -- issue 38: memory the job does not own, and searches that must go on past one verdict that cannot tell ---------

@dataclass(frozen=True)
class Neighbour:
    """Another process on the job's GPU: it takes ``gib`` from step ``arrives`` until ``leaves`` (None: stays)."""
    arrives: int
    gib: float
    leaves: Optional[int] = None

    def held_gib(self, i: int) -> float:
        return self.gib if self.arrives <= i and (self.leaves is None or i < self.leaves) else 0.0


def neighbour() -> Workload:
    """A generation-bound job (0.3 s + 30 ms a sample, ±3 %) whose memory grows 1.5 GiB a sample (2 GiB base) on
    the 141 GiB GPU, reporting its allocator's peak and reserved bytes and the GPU's free memory every step. At a
    step drawn per run from its random seed (40–80) another process takes 5–50 % of the GPU, and in half the runs
    leaves 60–100 steps later. Where the job's peak no longer fits beside it the step OOMs and the batch is halved
    from the next step, as the hook does (the batch never goes back above the size that failed). Scored on the
    steps the neighbour is there: OOMs after the first, steps until the batch fits under the line beside it, throughput
    against the best static setting that is safe beside it (``bench/workloads.py: neighbour_score``)."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = _noisy(rng, _batch_time(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b

    def arrival(seed: int) -> Neighbour:
        rng = random.Random(seed * 7919 + 38)
        arrives, share = rng.randint(40, 80), rng.uniform(0.05, 0.5)
        return Neighbour(arrives, round(share * LIMIT_GIB, 1), arrives + rng.randint(60, 100) if rng.random() < 0.5
                         else None)
    return Workload("neighbour takes 5–50 % of the GPU (1.5 GiB/sample)",
                    {"batch_size": {"value": 4, "min": 1, "max": 128}}, step,
                    [{"batch_size": b} for b in range(4, 96, 4)], memory_gib=lambda k: 2.0 + 1.5 * k["batch_size"],
                    steps=220, neighbour=arrival)


def comm_bound_noisy() -> Workload:
    """The two-rank communication-bound job as users run it: 0.25 s of compute at ±20 % a step, a 0.5 s all-reduce
    every sync_every steps (at sync 8 communication is ~20 % of the step; 8 → 16 pays +11 %, 16 → 32 +6 %): one
    rung read as flat must not end the ladder while the rule still fires. Best at the max, 32."""
    def step(k, i, rng):
        sync = int(k["sync_every"])
        comm = 0.5 if (i + 1) % sync == 0 else 0.0
        t = _noisy(rng, 0.25, 0.2) + comm
        return t, {"generation": t - comm - 0.05, "update": 0.05, **({"communication": comm} if comm else {})}, 16
    return Workload("communication-bound, noisy ±20 % (2 ranks)", {"sync_every": {"value": 1, "min": 1, "max": 32}},
                    step, [{"sync_every": s} for s in (1, 2, 4, 8, 16, 32)], ranks=2, steps=160)


def non_monotone_noisy() -> Workload:
    """The non-monotone batch curve (peak 24, falling past 32) at ±10 % step noise from batch 4: its best must be
    tried although a rung on the way reads flat."""
    w = non_monotone()

    def step(k, i, rng):
        t, _, b = w.step(k, i, rng)
        t = _noisy(rng, t, 0.1)
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


def mix() -> Workload:
    """Two knobs on one job, and a neighbour: the noisy communication-bound ladder (sync_every) on a job whose
    generation grows with the batch (memory 2 GiB + 1.5 GiB a sample), another process arriving as in
    ``neighbour``."""
    def step(k, i, rng):
        b, sync = int(k["batch_size"]), int(k["sync_every"])
        comm = 0.5 if (i + 1) % sync == 0 else 0.0
        compute = _noisy(rng, _batch_time(b), 0.1)
        t = compute + comm
        return t, {"generation": 0.9 * compute, "update": 0.1 * compute,
                   **({"communication": comm} if comm else {})}, b
    w = neighbour()
    return Workload("mix: batch and sync, a neighbour arrives", {"batch_size": {"value": 4, "min": 1, "max": 128},
                                                                 "sync_every": {"value": 1, "min": 1, "max": 32}},
                    step, [{"batch_size": b, "sync_every": s} for b in range(8, 96, 8) for s in (1, 4, 16, 32)],
                    memory_gib=w.memory_gib, steps=220, neighbour=w.neighbour)


WORKLOADS.update({"neighbour": neighbour, "comm_noisy": comm_bound_noisy, "non_monotone_noisy": non_monotone_noisy,
                  "slowdown_at_move": slowdown_at_a_move, "mix": mix})
