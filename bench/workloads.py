"""Workloads the rebalancer was not designed on (issue 15), end to end on a CPU: a synthetic job posts its step
reports to a live API (real store, real Rebalancer on every report), applies the changes that come back at the
next step boundary on every rank and acknowledges them. Step times are simulated seconds (the controller judges
reported step times), so a run of 92 steps takes a second or two of wall time. Each workload's best static
setting is measured in the same run, on the same simulated job, over a small grid.

Per run: fraction of the best static reached — the throughput that the settings the rebalancer ran at steps 60–91
deliver (exploration included; 32 steps, a whole number of every sync period in the grids), each setting's
throughput measured over 640 simulated steps, over the best's — and beside it the tail's own measured throughput
(at ±20 % step noise 32 steps read ±2 % by themselves); steps to within 5 % (from then on every step's setting
measures ≥ 95 % of the best); changes, rollbacks, OOMs. Goal for each: ≥ 95 % within 60 steps, no OOM, no change kept that measured
worse with confidence. ``tests/control/test_workloads_e2e.py`` runs each once and asserts the goal; this
script runs them over several seeds for the figures in BENCHMARKS.md:

    python bench/workloads.py --seeds 1-10

Issue 20 adds four jobs unlike the ones the rebalancer was built on (fast 5–12 ms steps, a knob that does nothing
behind a warm-up, a noisy non-monotone curve with a known loser, a two-rank sync ladder whose best is 64; 160 steps
but the fast one) and two more counts: gains kept that the static settings do not show (warm-up or noise credited to
a change) and values measured worse with confidence tried again without the job having moved; then two habits of the
lent H200's host (a host that slows by itself, a host whose speed shifts in regimes), a job that stalls, three
jobs with two knobs in series (prefetch, then sync; one whose prefetch raise leaves a bank that drains, as on the
H200; one that reports its queue's high-water mark, as the reference pipeline does), and two bounded queues
simulated batch by batch that report their high-water mark (one never fills past prefetch 1, one fills now and then
between bursts of slow generation). Issue 38 adds a job with a neighbour on its GPU (another process takes 5–50 %
of it at a step drawn from the run's random seed; scored by ``neighbour_score`` on the steps it is there: OOMs
after the first, steps until the batch fits under the line beside it, throughput against the best static setting
safe beside it),
a noisy two-rank communication-bound job, a noisy non-monotone batch curve, a host that slows ×1.3 at the step the
first move lands, and a mix (batch and sync, a neighbour). The jobs are named in ``bench/job_models.py``. A smoke
run (no goal, a few seconds):
``python bench/workloads.py --seeds 1 --max-steps 40``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.job_models import WORKLOADS  # noqa: E402
from bench.synthetic_job import GIB, GOAL_STEPS, LIMIT_GIB, Workload, learning_declaration  # noqa: E402
from bench.live_api import _seeds, local_api  # noqa: E402
from trimtab.control.bracket import REAPPLIED  # noqa: E402


def measure(w: Workload, setting: dict, seed: int, n: int = 64, first_step: int = 0) -> float:
    """Samples/s of a static setting over ``n`` simulated steps from ``first_step``."""
    rng = random.Random(seed)
    samples = seconds = 0.0
    for i in range(first_step, first_step + n):
        t, _, s = w.step(setting, i, rng)
        samples, seconds = samples + s, seconds + t
    return samples / seconds


def run(http: httpx.Client, token: str, w: Workload, seed: int, job: str = "w",
        max_steps: Optional[int] = None) -> dict:
    """The workload under the rebalancer (mode auto) through the API at ``http``'s base URL (``max_steps``: cut
    the run short, a smoke run)."""
    auth = {"Authorization": f"Bearer {token}"}
    declaration = {"name": job, "ranks": w.ranks, "device_map": {}, "hostnames": ["cpu"], "knobs": w.knobs,
                   "mode": "auto", "rules": learning_declaration(w)}  # its knobs model throughput only
    r = http.post("/v1/jobs", json=declaration, headers=auth)
    assert r.status_code == 201, r.text
    setting = {k: v["value"] for k, v in w.knobs.items()}
    rng = random.Random(seed)
    history, ooms, oom_steps = [], 0, []
    other = w.neighbour(seed) if w.neighbour is not None else None
    bounds = {k: dict(v) for k, v in w.knobs.items()}
    for i in range(w.steps if max_steps is None else min(w.steps, max_steps)):
        t, phases, samples = w.step(setting, i, rng)
        memory, ran_at, halved = None, dict(setting), False
        if w.memory_gib is not None:
            peak, held = w.memory_gib(setting), (other.held_gib(i) if other is not None else 0.0)
            if peak + held > LIMIT_GIB:
                ooms += 1
                oom_steps.append(i)
                halved = other is not None  # as the hook does: the step is lost, the batch halved from the next
            peak = min(peak, LIMIT_GIB - held)
            memory = {"peak_allocated_bytes": int(peak * GIB), "total_bytes": int(LIMIT_GIB * GIB), "num_ooms": ooms}
            if other is not None:  # the job reads the GPU's free memory (torch.cuda.mem_get_info) beside its own
                memory.update(reserved_bytes=int(peak * GIB), free_bytes=int((LIMIT_GIB - peak - held) * GIB))
        if halved:
            samples, failed = 0, int(setting["batch_size"])
            setting["batch_size"] = max(1, failed // 2)
            bounds["batch_size"].update(value=setting["batch_size"], max=min(bounds["batch_size"]["max"], failed - 1))
        history.append((ran_at, samples, t))
        for rank in range(w.ranks):
            body = {"step": i, "rank": rank, "step_time_s": t, "phases": phases, "samples": samples // w.ranks,
                    "knobs": ran_at, **(w.report() if w.report is not None else {})}
            if memory is not None:
                body["memory"] = memory
            r = http.post(f"/v1/jobs/{job}/reports", json=body, headers=auth)
            assert r.status_code == 200, r.text
        if halved:  # the hook declares the new value and ceiling again (pending changes above it are cancelled)
            r2 = http.post("/v1/jobs", json={**declaration, "knobs": {**bounds, **{
                k: {**bounds[k], "value": setting[k]} for k in bounds}}}, headers=auth)
            assert r2.status_code in (200, 201), r2.text
            continue
        for c in r.json()["pending_changes"]:  # applied at the next boundary on every rank, then acknowledged
            setting[c["knob"]] = c["value"]
            for rank in range(w.ranks):
                http.post(f"/v1/jobs/{job}/acks", json={"change_id": c["change_id"], "applied_at_step": i + 1,
                                                        "rank": rank}, headers=auth)
    decisions = http.get("/v1/decisions", params={"job": job, "limit": 200}).json()["decisions"]
    return {"history": history, "decisions": decisions, "ooms": ooms, "oom_steps": oom_steps,
            "neighbour": other}


@dataclass
class Score:
    name: str
    reached: float                 # what the tail's settings deliver / best static
    measured: float                # the tail's measured throughput / best static
    within: Optional[int]          # first step from which every step's setting measures ≥ 95 % of the best
    changes: int
    rollbacks: int
    ooms: int
    kept_worse: list               # decisions kept although they measured worse with confidence
    best: dict
    final: dict
    false_gains: list = None       # kept as a gain, but the static settings say the move gained nothing (< +1 %):
                                   # warm-up or noise credited to a change
    retried: list = None           # moves to a value measured worse with confidence before, the job not moved since
    neighbour: Optional[dict] = None  # a workload with a neighbour on the GPU: neighbour_score's figures
    host_rollbacks: int = 0        # rollbacks a later move re-applied, the known setting having read slower too (the
                                   # host's slowdown, not the move's: a measurement of the known setting, no flip-flop)
    flip_flops: int = 0            # the most rollbacks on one knob, less those (issue 38: at most 1 a knob)

    def line(self) -> str:
        return (f"{self.name}: reached {self.reached:.1%} of best static ({self.best}; the tail measured "
                f"{self.measured:.1%}), within 5 % from step "
                f"{self.within}, {self.changes} changes, {self.rollbacks} rollbacks ({self.host_rollbacks} the host's, "
                f"re-applied; at most {self.flip_flops} a knob less those), {self.ooms} OOMs, "
                f"{len(self.false_gains or [])} false gains, {len(self.retried or [])} losers retried; final "
                f"{self.final}")

    @property
    def met(self) -> bool:
        if self.neighbour is not None:
            return self.neighbour["met"]
        return (self.reached >= 0.95 and self.within is not None and self.within <= GOAL_STEPS and self.ooms == 0
                and not self.kept_worse and not self.false_gains and not self.retried)


def score(w: Workload, out: dict) -> Score:
    """The run against the best static setting of the grid, measured now (from the tail's first step, so a
    slowdown halfway is in both)."""
    measured: dict = {}

    def level(setting: dict) -> float:
        key = tuple(sorted(setting.items()))
        if key not in measured:
            measured[key] = measure(w, setting, seed=7, n=640, first_step=GOAL_STEPS)
        return measured[key]

    fits = [g for g in w.grid if w.memory_gib is None or w.memory_gib(g) <= LIMIT_GIB]
    best_setting = max(fits, key=level)
    best = level(best_setting)
    tail = out["history"][GOAL_STEPS:] or out["history"]  # a smoke run shorter than the goal: the whole run
    delivered = sum(n for _, n, _ in tail) / sum(n / level(s) for s, n, _ in tail)
    tail_measured = sum(n for _, n, _ in tail) / sum(t for _, _, t in tail)
    good = [level(s) >= 0.95 * best for s, _, _ in out["history"]]
    within = next((i for i in range(len(good)) if all(good[i:])), None)
    changes = [d for d in out["decisions"] if d["change_id"] is not None]
    rollbacks = [d for d in changes if d["outcome"] == "rolled_back"]

    def worse(d: dict) -> bool:
        v = d["evidence"].get("verdict") or {}
        return v.get("result") == "worse" or (v.get("ratio", 1.0) < 1.0 and v.get("confidence_pct", 0.0) >= 95.0)

    kept_worse = [d for d in changes if d["outcome"] == "kept" and worse(d)]

    def moved(d: dict) -> dict:
        return {**out["history"][-1][0], d["knob"]: d["new_value"]}

    def before(d: dict) -> dict:
        return {**out["history"][-1][0], d["knob"]: d["old_value"]}

    false_gains = [d for d in changes if d["outcome"] == "kept"
                   and (d["evidence"].get("verdict") or {}).get("result") == "gain"
                   and level(moved(d)) < 1.01 * level(before(d))]
    host = {(d["evidence"].get(REAPPLIED) or {}).get("decision") for d in changes} - {None}
    per_knob: dict = {}
    for d in rollbacks:
        if d["id"] not in host:
            per_knob[d["knob"]] = per_knob.get(d["knob"], 0) + 1
    return Score(w.name, delivered / best, tail_measured / best, within, len(changes), len(rollbacks), out["ooms"],
                 kept_worse, best_setting, out["history"][-1][0], false_gains, retried_losers(w, changes),
                 host_rollbacks=sum(d["id"] in host for d in rollbacks), flip_flops=max(per_knob.values(), default=0))


LINE_PCT = 95.0  # rules.toml's memory_line_pct: a batch "fits beside the neighbour" with its peak under this


def neighbour_score(w: Workload, out: dict) -> dict:
    """A run with a neighbour on the GPU, over the steps it is there: OOMs after the first, steps from its arrival
    until the batch fits under the line beside it (and stays there), and the throughput the settings delivered
    (a step lost to an OOM delivers nothing) against the best static setting of the grid that is safe beside it."""
    other, history = out["neighbour"], out["history"]
    end = min(len(history), other.leaves or len(history))
    level = {}

    def rate(setting: dict) -> float:
        key = tuple(sorted(setting.items()))
        if key not in level:
            level[key] = measure(w, setting, seed=7, n=640, first_step=GOAL_STEPS)
        return level[key]

    def fits(setting: dict, limit: float) -> bool:
        return w.memory_gib(setting) + other.gib <= limit

    safe = [g for g in w.grid if fits(g, LIMIT_GIB)]
    best = max(safe, key=rate)
    during = history[other.arrives:end]
    lost = set(out["oom_steps"])
    delivered = sum(n for _, n, _ in during) / sum(
        (t if i + other.arrives in lost else n / rate(s)) for i, (s, n, t) in enumerate(during))
    under = [fits(s, LIMIT_GIB * LINE_PCT / 100.0) for s, _, _ in during]
    lowered = next((i for i in range(len(under)) if all(under[i:])), None)
    first = next((i for i in out["oom_steps"] if i >= other.arrives), None)
    after_first = [i for i in out["oom_steps"] if first is not None and i > first]
    met = not after_first and lowered is not None and lowered <= 5 and delivered / rate(best) >= 0.90
    line = (f"neighbour {other.gib:g} GiB at steps {other.arrives}–{other.leaves or 'end'}: "
            f"{delivered / rate(best):.1%} of the best static safe beside it ({best}), fits under the line from "
            f"{lowered} steps after it came, "
            f"OOMs {len(out['oom_steps'])} ({len(after_first)} after the first)")
    return {"ratio": delivered / rate(best), "lowered_after": lowered, "ooms_after_first": len(after_first),
            "met": met, "line": line}


def retried_losers(w: Workload, changes: list[dict]) -> list[dict]:
    """Moves to a value that an earlier verdict measured worse with confidence (rolled back on a sure loss, or the
    old value of a sure gain), with no move of the job itself (``moved_at``) between the start of that verdict's
    windows and the move."""
    def step_of(d: dict, key: str, end: int = 1) -> int:
        return ((d["evidence"].get(key) or {}).get("steps") or [0, 0])[end]

    out = []
    oldest_first = sorted(changes, key=lambda d: d["id"])
    for i, d in enumerate(oldest_first):
        for e in oldest_first[:i]:
            result = (e["evidence"].get("verdict") or {}).get("result")
            loser = e["new_value"] if e["outcome"] == "rolled_back" and result == "worse" else \
                e["old_value"] if e["outcome"] == "kept" and result == "gain" else None
            if e["knob"] != d["knob"] or loser is None or float(loser) != float(d["new_value"]) \
                    or e["evidence"].get("remeasure"):
                continue  # (a change rolled back unjudged, its before window unsettled, lost nothing)
            if w.moved_at is not None and step_of(e, "before_window", 0) < w.moved_at <= step_of(d, "window"):
                continue  # the job moved after the verdict began (inside its windows too: the loss may be the move's)
            out.append({"decision": d["id"], "value": d["new_value"], "measured_worse_at": e["id"]})
            break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1-5", help="e.g. 11 or 1-10 or 1,4,7")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"from {','.join(WORKLOADS)}")
    ap.add_argument("--rules", default=None, help="a rules file (only the keys it names change): e.g. the "
                                                  "controller as it was before a fix, for a before/after figure")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="cut every run to this many steps (a smoke run: --seeds 1 --max-steps 40)")
    args = ap.parse_args()
    results: dict[str, list[Score]] = {}
    with local_api("workloads", args.rules) as (http, token):
        for seed in _seeds(args.seeds):
            for key in args.workloads.split(","):
                w = WORKLOADS[key]()
                out = run(http, token, w, seed, job=f"{key}-{seed}", max_steps=args.max_steps)
                s = score(w, out)
                results.setdefault(key, []).append(s)
                if w.neighbour is not None and args.max_steps is None:
                    s.neighbour = neighbour_score(w, out)
                    print(f"seed {seed}: {s.neighbour['line']}{'' if s.neighbour['met'] else '  ← goal missed'}",
                          flush=True)
                    continue
                print(f"seed {seed}: {s.line()}{'' if s.met else '  ← goal missed'}", flush=True)
    print("\n| workload | runs | goal met | reached: mean [min, max] | tail measured: mean [min, max] | "
          "steps to within 5 %: median [max] | changes (mean) | rollbacks (mean) | of them the host's, re-applied "
          "(mean) | rollbacks on one knob less the host's: median [max] | OOMs | kept worse | false gains | "
          "losers retried |")
    print("|---|---:|---:|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|")

    def spread(values: list[float]) -> str:
        return f"{100 * statistics.fmean(values):.1f} % [{100 * min(values):.1f}, {100 * max(values):.1f}]"

    for key, scores in results.items():
        within = [s.within if s.within is not None else WORKLOADS[key]().steps for s in scores]
        print(f"| {scores[0].name} | {len(scores)} | {sum(s.met for s in scores)} | "
              f"{spread([s.reached for s in scores])} | {spread([s.measured for s in scores])} | "
              f"{statistics.median(within):g} [{max(within)}] | {statistics.fmean(s.changes for s in scores):.1f} | "
              f"{statistics.fmean(s.rollbacks for s in scores):.1f} | "
              f"{statistics.fmean(s.host_rollbacks for s in scores):.1f} | "
              f"{statistics.median(s.flip_flops for s in scores):g} [{max(s.flip_flops for s in scores)}] | "
              f"{sum(s.ooms for s in scores)} | "
              f"{sum(len(s.kept_worse) for s in scores)} | {sum(len(s.false_gains) for s in scores)} | "
              f"{sum(len(s.retried) for s in scores)} |")
    with_neighbour = {k: v for k, v in results.items() if v[0].neighbour is not None}
    if with_neighbour:
        print("\n| workload | runs | goal met | of the best static safe beside the neighbour: mean [min, max] | "
              "steps until under the line: median [max] | OOMs after the first |")
        print("|---|---:|---:|---|---|---:|")
    for key, scores in with_neighbour.items():
        lowered = [s.neighbour["lowered_after"] if s.neighbour["lowered_after"] is not None else 999 for s in scores]
        print(f"| {scores[0].name} | {len(scores)} | {sum(s.met for s in scores)} | "
              f"{spread([s.neighbour['ratio'] for s in scores])} | {statistics.median(lowered):g} [{max(lowered)}] | "
              f"{sum(s.neighbour['ooms_after_first'] for s in scores)} |")
    if args.max_steps is not None:
        return 0  # a smoke run: too short for the goal
    return 0 if all(s.met for scores in results.values() for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
