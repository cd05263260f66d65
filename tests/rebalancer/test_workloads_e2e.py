"""Workloads the rebalancer was not designed on (issue 15), end to end on a CPU: a synthetic job posts its step
reports to a live API (real store, real Rebalancer on every report), applies the changes that come back at the
next step boundary on every rank and acknowledges them. Step times are simulated seconds (the controller judges
reported step times), so a run of 60 steps takes about a second of wall time. Each workload's best static setting
is measured in the same test, on the same simulated job, over a small grid.

Printed per workload: fraction of the best static reached (last 16 steps' measured throughput / best), steps to
within 5 % (from then on every step's setting measures ≥ 95 % of the best), changes, rollbacks, OOMs.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable

import pytest

from trimtab.rebalancer.service import Rebalancer

GIB = 2**30
STEPS = 60


@dataclass
class Workload:
    name: str
    knobs: dict                                   # name → {value, min, max}
    step: Callable[[dict, int, random.Random], tuple[float, dict, int]]  # (setting, step, rng) → t, phases, samples
    grid: list[dict]                              # static settings to measure
    ranks: int = 1
    memory_gib: Callable[[dict], float] | None = None  # the setting's peak; above LIMIT_GIB it OOMs
    noise: float = 0.03


LIMIT_GIB = 141.0


def _noisy(rng, t, noise):
    return t * (1 + rng.uniform(-noise, noise))


def comm_bound() -> Workload:
    def step(k, i, rng):
        sync = int(k["sync_every"])
        comm = 0.6 if (i + 1) % sync == 0 else 0.0
        t = _noisy(rng, 0.25, 0.03) + comm
        return t, {"generation": t - comm - 0.05, "update": 0.05, **({"communication": comm} if comm else {})}, 16
    return Workload("communication-bound (2 ranks)", {"sync_every": {"value": 1, "min": 1, "max": 32}}, step,
                    [{"sync_every": s} for s in (1, 2, 4, 8, 16, 32)], ranks=2)


def eval_bound(noise=0.03, slowdown_at=None) -> Workload:
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
                    [{"prefetch": p} for p in (0, 1, 2, 3, 4, 6, 8)], noise=noise)


def _batch_time(b: float) -> float:
    return 0.3 + 0.03 * b


def non_monotone() -> Workload:
    def rate(b):  # best at 24, falling after 32
        base = b / _batch_time(b)
        top = 24 / _batch_time(24)
        if b <= 24:
            return base
        return top * max(0.2, 1 - 0.005 * (min(b, 32) - 24) - 0.015 * max(0, b - 32))

    def step(k, i, rng):
        b = int(k["batch_size"])
        t = _noisy(rng, b / rate(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("non-monotone batch curve", {"batch_size": {"value": 1, "min": 1, "max": 128}}, step,
                    [{"batch_size": b} for b in (1, 4, 8, 16, 24, 32, 48, 64)])


def memory_growing() -> Workload:
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = _noisy(rng, _batch_time(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("memory-growing (3 GiB/sample, 141 GiB)", {"batch_size": {"value": 1, "min": 1, "max": 128}},
                    step, [{"batch_size": b} for b in (1, 4, 16, 32, 40, 46)],
                    memory_gib=lambda k: 2.0 + 3.0 * k["batch_size"])


def measure(w: Workload, setting: dict, seed: int, n: int = 64, first_step: int = 0) -> float:
    rng = random.Random(seed)
    samples = seconds = 0.0
    for i in range(first_step, first_step + n):
        t, _, s = w.step(setting, i, rng)
        samples, seconds = samples + s, seconds + t
    return samples / seconds


def run(api, w: Workload, seed: int) -> dict:
    job = {"name": "w", "ranks": w.ranks, "device_map": {}, "hostnames": ["cpu"], "knobs": w.knobs, "mode": "auto"}
    assert api.post("/v1/jobs", job, scope="job").status_code == 201
    setting = {k: v["value"] for k, v in w.knobs.items()}
    rng = random.Random(seed)
    history, ooms, ooms_seen = [], 0, 0
    for i in range(STEPS):
        t, phases, samples = w.step(setting, i, rng)
        memory = None
        if w.memory_gib is not None:
            peak = w.memory_gib(setting)
            if peak > LIMIT_GIB:
                ooms += 1
            memory = {"peak_allocated_bytes": int(min(peak, LIMIT_GIB) * GIB), "total_bytes": int(LIMIT_GIB * GIB),
                      "num_ooms": ooms}
        history.append((dict(setting), samples / t))
        for rank in range(w.ranks):
            body = {"step": i, "rank": rank, "step_time_s": t, "phases": phases, "samples": samples // w.ranks}
            if memory is not None:
                body["memory"] = memory
            r = api.post("/v1/jobs/w/reports", body, scope="job")
            assert r.status_code == 200, r.text
        for c in r.json()["pending_changes"]:  # applied at the next boundary on every rank, then acknowledged
            setting[c["knob"]] = c["value"]
            for rank in range(w.ranks):
                api.post("/v1/jobs/w/acks", {"change_id": c["change_id"], "applied_at_step": i + 1, "rank": rank},
                         scope="job")
        ooms_seen = ooms
    decisions = api.get("/v1/decisions", job="w").json()["decisions"]
    return {"history": history, "decisions": decisions, "ooms": ooms_seen}


WORKLOADS = [comm_bound, eval_bound, non_monotone, memory_growing, lambda: eval_bound(0.2, STEPS // 2)]


@pytest.mark.parametrize("make", WORKLOADS, ids=["comm", "eval", "non_monotone", "memory", "noisy"])
def test_workload_reaches_its_best_static_setting(sqlite_api, make):
    w = make()
    sqlite_api.ctx.after_report = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules).after_report
    out = run(sqlite_api, w, seed=11)
    tail_from = STEPS - 16  # a whole number of the longest sync period the grid holds (16 of 32: one sync)
    # The best static setting, measured in this run over the grid (for the slowdown: in the regime the run ends in).
    measured = {}

    def level(setting):
        key = tuple(sorted(setting.items()))
        if key not in measured:
            measured[key] = measure(w, setting, seed=7, first_step=tail_from)
        return measured[key]

    fits = [g for g in w.grid if w.memory_gib is None or w.memory_gib(g) <= LIMIT_GIB]
    best = max(level(g) for g in fits)
    reached = statistics.fmean(rate for _, rate in out["history"][tail_from:]) / best
    good = [level(s) >= 0.95 * best for s, _ in out["history"]]
    within = next((i for i in range(len(good)) if all(good[i:])), None)
    changes = [d for d in out["decisions"] if d["change_id"] is not None]
    rollbacks = [d for d in changes if d["outcome"] == "rolled_back"]
    kept_worse = [d for d in changes if d["outcome"] == "kept" and d["evidence"].get("verdict", {}).get("result") == "worse"]
    print(f"\n{w.name}: reached {reached:.1%} of best static ({max(fits, key=level)}), within 5 % from step "
          f"{within}, {len(changes)} changes, {len(rollbacks)} rollbacks, {out['ooms']} OOMs; final "
          f"{out['history'][-1][0]}")
    assert out["ooms"] == 0
    assert kept_worse == []
    assert not math.isnan(reached)
