"""A moving job (issue 20): a generation-bound decode job whose sequences grow 256 → 1024 tokens over 300 steps, with
KV-like memory per token, under the rebalancer in mode auto from batch 4 — does it follow the length (raise while
there is room, lower *before* the growth reaches the line) without an OOM, and how close does it come to the
best static batch and to the follow-the-length oracle, both measured in the same run?

* best static: the largest batch that fits at the run's longest length (it fits for the whole run);
* oracle: the largest batch that fits at each step's own length.

Throughput is samples over seconds of whole steps (a step lost to an OOM counts its time, not its samples).

    python bench/moving_job.py --device-map cpu --seeds 1-10     # simulated memory and time, deterministic per seed
    python bench/moving_job.py --device-map cpu --smoke          # the same, one seed, < 10 s
    python3 bench/moving_job.py --device-map cuda:0 --json m.json # the H200: real allocations under `trimtab up`
    python bench/moving_job.py --device-map cpu --live --steps 40  # the H200 path on the CPU (plumbing only)

CPU (``--device-map cpu``): the job's memory is 2 GiB + batch × length × ``--kv-mib-per-token`` against a 141 GiB
GPU (an OOM when above), its step time 0.8 s of weight-bound decode + 0.5 ms per sample + 1 µs per token in flight
(±3 % noise), the lengths ±2 % around the line, all drawn from the run's random seed; it posts its reports to a live API (real store,
real Rebalancer) and applies what comes back at the next step, as ``bench/workloads.py`` does — an OOM halves the
batch and lowers its max, as the hook does.

GPU (``--device-map cuda:N``): ``bench/moving_gpu.py`` — each step allocates the KV cache (batch × length ×
``--kv-mib-per-token``) for real and decodes through 8 bf16 8192² layers, attached through the hook to a real
`trimtab up` (NVML agent, SQLite); static and oracle batches are found by real allocations after the run, and
their throughput measured on every 10th step of the schedule.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.live_api import _seeds, local_api  # noqa: E402

GIB, MIB = 2**30, 2**20


@dataclass(frozen=True)
class Shape:
    """The moving job, as both modes run it."""
    steps: int = 300
    start_tokens: int = 256
    end_tokens: int = 1024
    kv_mib_per_token: float = 5.0   # per token per sample
    batch_start: int = 4
    batch_max: int = 512


@dataclass(frozen=True)
class SimJob:
    """The simulated job: memory and step time as functions of batch and length, noise drawn from the run's random seed."""
    shape: Shape
    seed: int
    limit_gib: float = 141.0
    base_gib: float = 2.0
    decode_s: float = 0.8
    per_sample_s: float = 0.0005
    per_token_s: float = 1e-6
    time_noise: float = 0.03
    length_noise: float = 0.02

    def lengths(self) -> list[int]:
        rng = random.Random(f"lengths-{self.seed}")
        s = self.shape
        return [round((s.start_tokens + (s.end_tokens - s.start_tokens) * i / max(1, s.steps - 1))
                      * (1 + rng.uniform(-self.length_noise, self.length_noise))) for i in range(s.steps)]

    def noise(self) -> list[float]:
        rng = random.Random(f"time-{self.seed}")
        return [1 + rng.uniform(-self.time_noise, self.time_noise) for _ in range(self.shape.steps)]

    def peak_bytes(self, batch: int, length: int) -> float:
        return (self.base_gib * GIB) + batch * length * self.shape.kv_mib_per_token * MIB

    def fits(self, batch: int, length: int) -> bool:
        return self.peak_bytes(batch, length) <= self.limit_gib * GIB

    def step_s(self, batch: int, length: int, noise: float) -> float:
        return (self.decode_s + self.per_sample_s * batch + self.per_token_s * batch * length) * noise

    def step_at(self, step: int, batch: int, length: int, noise: float) -> tuple[float, dict]:
        """The step's time and the phases it reports."""
        t = self.step_s(batch, length, noise)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}


def largest_fitting(fits: Callable[[int, int], bool], length: int, hi: int) -> int:
    """The largest batch in 1…hi that fits at ``length`` (0 when none), by bisection (fits is monotone in batch)."""
    lo, top = 0, hi
    while lo < top:
        mid = (lo + top + 1) // 2
        if fits(mid, length):
            lo = mid
        else:
            top = mid - 1
    return lo


@dataclass
class Run:
    batches: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    samples: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    ooms: list[int] = field(default_factory=list)      # steps lost to an OOM
    decisions: list[dict] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return sum(self.samples) / sum(self.seconds)

    def path(self) -> list[tuple[int, int, int]]:
        """(step, length, batch) where the batch moved."""
        return [(i, n, b) for i, (b, n) in enumerate(zip(self.batches, self.lengths))
                if i == 0 or b != self.batches[i - 1]]


def ooms_by_cause(run: Run) -> dict[str, int]:
    """Each OOM by what put the job at that batch: a raise (the batch went up since the last lower) or growth."""
    out = {"raise": 0, "growth": 0}
    for i in run.ooms:
        ups = [j for j in range(1, i + 1) if run.batches[j] > run.batches[j - 1]]
        downs = [j for j in range(1, i + 1) if run.batches[j] < run.batches[j - 1]]
        out["raise" if ups and (not downs or ups[-1] > downs[-1]) else "growth"] += 1
    return out


def run_simulated(http: httpx.Client, token: str, job: SimJob, name: str) -> Run:
    """The simulated job under the rebalancer (mode auto) through the API at ``http``'s base URL (``job``: a
    :class:`SimJob`, or any job with its ``shape``, ``limit_gib``, ``lengths``, ``noise``, ``step_at``, ``fits``
    and ``peak_bytes``: ``bench/drifting_jobs.py``'s)."""
    auth = {"Authorization": f"Bearer {token}"}
    s = job.shape
    knob = {"value": s.batch_start, "min": 1, "max": s.batch_max}

    def register() -> None:
        r = http.post("/v1/jobs", json={"name": name, "ranks": 1, "device_map": {}, "hostnames": ["cpu"],
                                        "knobs": {"batch_size": dict(knob)}, "mode": "auto"}, headers=auth)
        assert r.status_code in (200, 201), r.text

    register()
    run, ooms = Run(), 0
    for i, (length, noise) in enumerate(zip(job.lengths(), job.noise())):
        batch = int(knob["value"])
        t, phases = job.step_at(i, batch, length, noise)
        lost = not job.fits(batch, length)
        run.batches.append(batch)
        run.lengths.append(length)
        run.seconds.append(t)
        run.samples.append(0 if lost else batch)
        body = {"step": i, "rank": 0, "step_time_s": t, "phases": phases,
                "samples": 0 if lost else batch, "tokens": 0 if lost else batch * length}
        if lost:  # what the hook does: halve, never back above the size that failed, declare the new bounds
            run.ooms.append(i)
            ooms += 1
            body["memory"] = {"num_ooms": ooms, "total_bytes": int(job.limit_gib * GIB)}
        else:
            body["memory"] = {"peak_allocated_bytes": int(job.peak_bytes(batch, length)),
                              "total_bytes": int(job.limit_gib * GIB), "num_ooms": ooms}
        r = http.post(f"/v1/jobs/{name}/reports", json=body, headers=auth)
        assert r.status_code == 200, r.text
        if lost:
            knob.update(value=max(1, batch // 2), max=max(1, batch - 1))
            register()
            continue
        for c in r.json()["pending_changes"]:  # applied at the next boundary, then acknowledged
            if c["knob"] == "batch_size" and 1 <= c["value"] <= knob["max"]:
                knob["value"] = int(c["value"])
                http.post(f"/v1/jobs/{name}/acks", json={"change_id": c["change_id"], "applied_at_step": i + 1,
                                                         "rank": 0}, headers=auth)
    run.decisions = http.get("/v1/decisions", params={"job": name, "limit": 200}).json()["decisions"]
    return run


def baselines(job: SimJob) -> dict:
    """The best static batch and the follow-the-length oracle on the same lengths and noise."""
    lengths, noise = job.lengths(), job.noise()
    static = largest_fitting(job.fits, max(lengths), job.shape.batch_max)
    oracle = [largest_fitting(job.fits, n, job.shape.batch_max) for n in lengths]
    tp_static = static * len(lengths) / sum(job.step_s(static, n, e) for n, e in zip(lengths, noise))
    tp_oracle = sum(oracle) / sum(job.step_s(b, n, e) for b, n, e in zip(oracle, lengths, noise))
    return {"static_batch": static, "static_samples_per_s": tp_static, "oracle_batches": oracle,
            "oracle_samples_per_s": tp_oracle}


def report(run: Run, base: dict, label: str) -> dict:
    """The figures of one run against its baselines, printed and returned."""
    causes = ooms_by_cause(run)
    out = {"label": label, "samples_per_s": round(run.throughput, 3),
           "of_static_pct": round(100 * run.throughput / base["static_samples_per_s"], 1),
           "oracle_of_static_pct": round(100 * base["oracle_samples_per_s"] / base["static_samples_per_s"], 1),
           "of_oracle_pct": round(100 * run.throughput / base["oracle_samples_per_s"], 1),
           "static_batch": base["static_batch"], "ooms": len(run.ooms), "ooms_after_a_raise": causes["raise"],
           "ooms_from_growth": causes["growth"], "changes": sum(d["change_id"] is not None for d in run.decisions),
           "path": [{"step": i, "tokens": n, "batch": b, "oracle": base["oracle_batches"][i]}
                    for i, n, b in run.path()],
           "decisions": [{"rule": d["rule"], "change": [d["old_value"], d["new_value"]], "outcome": d["outcome"],
                          "applied_step": d["applied_step"], "memory": d["evidence"].get("memory_prediction"),
                          "closed_because": d["evidence"].get("closed_because")}
                         for d in reversed(run.decisions) if d["change_id"] is not None]}
    print(f"{label}: {out['samples_per_s']:.2f} samples/s = {out['of_static_pct']:.1f} % of the best static batch "
          f"({out['static_batch']}), {out['of_oracle_pct']:.1f} % of the oracle (oracle "
          f"{out['oracle_of_static_pct']:.1f} "
          f"% of static); OOMs {out['ooms']} (after a raise {causes['raise']}, from growth {causes['growth']}); "
          f"{out['changes']} changes", flush=True)
    return out


def print_path(out: dict) -> None:
    print("  batch path (step: tokens per sample → batch, oracle there): " + ", ".join(
        f"{p['step']}: {p['tokens']} → {p['batch']} ({p['oracle']})" for p in out["path"]))


def simulate(args) -> int:
    shape = Shape(steps=args.steps, kv_mib_per_token=args.kv_mib_per_token)
    results = []
    with local_api("moving") as (http, token):
        for seed in args.seeds:
            job = SimJob(shape, seed)
            out = report(run_simulated(http, token, job, f"moving-{seed}"), baselines(job), f"seed {seed}")
            if args.path or len(args.seeds) == 1:
                print_path(out)
            results.append(out)
    ofs = [r["of_static_pct"] for r in results]
    orc = [r["of_oracle_pct"] for r in results]
    print(f"\n{len(results)} seeds: {statistics.fmean(ofs):.1f} % of the best static [{min(ofs):.1f}, {max(ofs):.1f}], "
          f"{statistics.fmean(orc):.1f} % of the oracle [{min(orc):.1f}, {max(orc):.1f}] (oracle "
          f"{statistics.fmean(r['oracle_of_static_pct'] for r in results):.1f} % of static); OOMs "
          f"{sum(r['ooms'] for r in results)}; changes {statistics.fmean(r['changes'] for r in results):.1f} a run")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["ooms"] == 0 and r["of_static_pct"] >= args.goal_pct for r in results) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device-map", "--device", dest="device_map", default="cpu", help="cpu (simulated) or cuda:N")
    ap.add_argument("--seeds", type=_seeds, default=[1], help="CPU: e.g. 1-10")
    ap.add_argument("--smoke", action="store_true", help="CPU: one seed, the whole run (< 10 s)")
    ap.add_argument("--live", action="store_true", help="the GPU path (trimtab up, the hook) on the CPU, tiny")
    ap.add_argument("--steps", type=int, default=Shape.steps)
    ap.add_argument("--kv-mib-per-token", type=float, default=Shape.kv_mib_per_token)
    ap.add_argument("--goal-pct", type=float, default=150.0,
                    help="exit 1 below this %% of the best static (or on an OOM)")
    ap.add_argument("--path", action="store_true", help="print the batch path of every seed")
    ap.add_argument("--step-s", type=float, default=0.8, help="GPU: the decode step's time (calibrated at batch 64)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="GPU: stop the auto run after this long")
    ap.add_argument("--baseline-every", type=int, default=10, help="GPU: static and oracle timed on every Nth step")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.smoke:
        args.seeds = args.seeds[:1]
    if args.device_map == "cpu" and not args.live:
        return simulate(args)
    from bench.moving_gpu import run_gpu  # torch only where a real job runs

    return run_gpu(args, Shape(steps=args.steps, kv_mib_per_token=args.kv_mib_per_token))


if __name__ == "__main__":
    sys.exit(main())
