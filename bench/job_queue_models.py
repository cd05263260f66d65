"""Synthetic jobs with a prefetch queue (issues 20 and 38): prefetch then a weight sync in series (two knobs), and a
bounded queue between a generation worker and the trainer, simulated batch by batch, reporting its high-water
mark as the reference pipeline does.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from bench.synthetic_job import Workload, noisy_s


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
        t = noisy_s(rng, compute + wait, 0.05) * (0.85 if i < seen["drain_until"] else 1.0)
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
        end = taken + noisy_s(rng, self.train_s, 0.05)
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
        q = _BoundedQueue(lambda rng: noisy_s(rng, 0.5, 0.05), 0.35)
    name = "bounded queue, " + ("bursty generation (fills now and then)" if bursty else
                                "generation-bound (never fills)")
    return Workload(name, {"prefetch": {"value": 0, "min": 0, "max": 8}}, q.step,
                    [{"prefetch": p} for p in (0, 1, 2, 4, 8)], steps=160,
                    report=lambda: {"queue_high_water": q.mark})
