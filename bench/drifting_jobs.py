"""Jobs whose step time drifts (issue 38), end to end on a CPU: a decode job whose response lengths move — up
(128 → 512 tokens), down (512 → 128), a curriculum (384 → 128, then → 512) and the upward drift with a validation
pass every 20 steps (10× a step) — posts its reports (``samples``, ``tokens``, allocator peaks) to a live API (real
store, real Rebalancer), from batch 4 in mode auto, as the README's hook route does, and applies what comes back at
the next step; an OOM halves the batch and lowers its max, as the hook does.

The physics: a step decodes one token position at a time, so its time is the length × (1.5 ms of weight-bound
decode + 2 µs a sample) + 4 ms of update (±3 % noise; generation ~98 % of the step at batch 4, 128 tokens, 0.2 s);
memory is 2 GiB + batch × length × 4.5 MiB (KV cache: tokens in flight) on a 141 GiB GPU. Lengths ±3 % around
their line. Against, on the same lengths and noise:

* the largest static batch safe over the whole run (fits at its longest length; throughput rises with the batch,
  so it is also the best static);
* the follow-the-length oracle: the largest batch that fits at each step's own length.

Goals (issue 38): ≥ 150 % of the static, ≥ 80 % of the oracle, no OOM after a raise, the first decision within 30
steps.

    python bench/drifting_jobs.py --seeds 1-10
    python bench/drifting_jobs.py --seeds 1 --jobs up --path     # one run, with its batch path
    python bench/drifting_jobs.py --smoke                        # 40 steps of one run, no goal
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.live_api import _seeds, local_api  # noqa: E402
from bench.moving_job import GIB, MIB, Run, Shape, largest_fitting, ooms_by_cause, run_simulated  # noqa: E402

LIMIT_GIB, BASE_GIB, KV_MIB_PER_TOKEN = 141.0, 2.0, 4.5
DECODE_S, DECODE_PER_SAMPLE_S, UPDATE_S = 1.5e-3, 2e-6, 0.004
BATCH_START, BATCH_MAX = 4, 1024


@dataclass(frozen=True)
class DriftJob:
    name: str
    steps: int
    length_at: Callable[[float], float]  # fraction of the run (0 … 1) → mean tokens per sample
    eval_every: Optional[int] = None     # a validation pass every this many steps …
    eval_s: float = 2.0                  # … this long (10× the 0.2 s step at batch 4, 128 tokens)


@dataclass(frozen=True)
class SeededJob:
    """One seed of a :class:`DriftJob`, as ``bench/moving_job.py``'s ``run_simulated`` runs it."""
    job: DriftJob
    seed: int
    shape: Shape = Shape(batch_start=BATCH_START, batch_max=BATCH_MAX)
    limit_gib: float = LIMIT_GIB

    def lengths(self) -> list[int]:
        rng = random.Random(f"lengths-{self.job.name}-{self.seed}")
        return [round(self.job.length_at(i / max(1, self.job.steps - 1)) * (1 + rng.uniform(-0.03, 0.03)))
                for i in range(self.job.steps)]

    def noise(self) -> list[float]:
        rng = random.Random(f"time-{self.job.name}-{self.seed}")
        return [1 + rng.uniform(-0.03, 0.03) for _ in range(self.job.steps)]

    def heavy_s(self, i: int) -> float:
        every = self.job.eval_every
        return self.job.eval_s if every and (i + 1) % every == 0 else 0.0

    def step_at(self, i: int, batch: int, length: int, noise: float) -> tuple[float, dict]:
        gen = length * (DECODE_S + DECODE_PER_SAMPLE_S * batch) * noise
        heavy = self.heavy_s(i)
        return gen + UPDATE_S + heavy, {"generation": gen, "update": UPDATE_S, **({"validation": heavy} if heavy else {})}

    @staticmethod
    def peak_bytes(batch: int, length: int) -> float:
        return BASE_GIB * GIB + batch * length * KV_MIB_PER_TOKEN * MIB

    def fits(self, batch: int, length: int) -> bool:
        return self.peak_bytes(batch, length) <= LIMIT_GIB * GIB


def _line(a: float, b: float) -> Callable[[float], float]:
    return lambda f: a + (b - a) * f


def _curriculum(f: float) -> float:
    return 384 - 256 * f / 0.4 if f < 0.4 else 128 + 384 * (f - 0.4) / 0.6


JOBS = {"up": DriftJob("drift up 128 → 512", 200, _line(128, 512)),
        "down": DriftJob("drift down 512 → 128", 200, _line(512, 128)),
        "curriculum": DriftJob("curriculum 384 → 128 → 512", 300, _curriculum),
        "up_eval": DriftJob("drift up + validation every 20 (10×)", 200, _line(128, 512), eval_every=20)}


def _throughput(job: SeededJob, batches: list[int]) -> float:
    lengths, noise = job.lengths(), job.noise()
    samples = sum(b if job.fits(b, n) else 0 for b, n in zip(batches, lengths))
    seconds = sum(job.step_at(i, b, n, e)[0] for i, (b, n, e) in enumerate(zip(batches, lengths, noise)))
    return samples / seconds


def score(job: SeededJob, run: Run) -> dict:
    """The run against the largest static batch safe over it and the follow-the-length oracle."""
    lengths = job.lengths()
    static = largest_fitting(job.fits, max(lengths), BATCH_MAX)
    oracle = [largest_fitting(job.fits, n, BATCH_MAX) for n in lengths]
    tp_static = _throughput(job, [static] * len(lengths))
    tp_oracle = _throughput(job, oracle)
    changes = sorted((d for d in run.decisions if d["change_id"] is not None), key=lambda d: d["id"])
    first = ((changes[0]["evidence"].get("window") or {}).get("steps") or [None, None])[1] if changes else None
    causes = ooms_by_cause(run)
    out = {"job": job.job.name, "seed": job.seed, "of_static_pct": 100 * run.throughput / tp_static,
           "of_oracle_pct": 100 * run.throughput / tp_oracle, "oracle_of_static_pct": 100 * tp_oracle / tp_static,
           "static_batch": static, "first_decision_step": first, "changes": len(changes),
           "rollbacks": sum(d["outcome"] == "rolled_back" for d in changes), "ooms": len(run.ooms),
           "ooms_after_a_raise": causes["raise"], "path": run.path(), "oracle": oracle}
    out["met"] = (out["of_static_pct"] >= 150 and out["of_oracle_pct"] >= 80 and causes["raise"] == 0
                  and first is not None and first <= 30)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=_seeds, default=[1], help="e.g. 1-10")
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"from {','.join(JOBS)}")
    ap.add_argument("--rules", default=None, help="a rules file (only the keys it names change)")
    ap.add_argument("--path", action="store_true", help="print each run's batch path")
    ap.add_argument("--smoke", action="store_true", help="one seed of the growing job, 40 steps (no goal, seconds)")
    args = ap.parse_args()
    jobs = dict(JOBS)
    if args.smoke:
        args.seeds, args.jobs, jobs["up"] = [1], "up", replace(JOBS["up"], steps=40)
    results: dict[str, list[dict]] = {}
    with local_api("drifting", args.rules) as (http, token):
        for seed in args.seeds:
            for key in args.jobs.split(","):
                job = jobs[key]
                seeded = SeededJob(job, seed)
                s = score(seeded, run_simulated(http, token, seeded, f"{key}-{seed}"))
                results.setdefault(key, []).append(s)
                print(f"seed {seed}: {job.name}: {s['of_static_pct']:.1f} % of the static batch ({s['static_batch']}), "
                      f"{s['of_oracle_pct']:.1f} % of the oracle (oracle {s['oracle_of_static_pct']:.1f} % of static); "
                      f"first decision at step {s['first_decision_step']}; {s['changes']} changes, {s['rollbacks']} "
                      f"rollbacks, {s['ooms']} OOMs ({s['ooms_after_a_raise']} after a raise)"
                      f"{'' if s['met'] else '  ← goal missed'}", flush=True)
                if args.path:
                    print("  path (step: tokens → batch, oracle): " + ", ".join(
                        f"{i}: {n} → {b} ({s['oracle'][i]})" for i, n, b in s["path"]))
    print("\n| job | runs | goal met | % of static: mean [min, max] | % of oracle: mean [min, max] | "
          "first decision: median [max] | changes | rollbacks | OOMs (after a raise) |")
    print("|---|---:|---:|---|---|---|---:|---:|---|")

    def spread(values: list[float]) -> str:
        return f"{statistics.fmean(values):.1f} [{min(values):.1f}, {max(values):.1f}]"

    for key, scores in results.items():
        firsts = [s["first_decision_step"] if s["first_decision_step"] is not None else jobs[key].steps
                  for s in scores]
        print(f"| {jobs[key].name} | {len(scores)} | {sum(s['met'] for s in scores)} | "
              f"{spread([s['of_static_pct'] for s in scores])} | {spread([s['of_oracle_pct'] for s in scores])} | "
              f"{statistics.median(firsts):g} [{max(firsts)}] | {statistics.fmean(s['changes'] for s in scores):.1f} | "
              f"{statistics.fmean(s['rollbacks'] for s in scores):.1f} | {sum(s['ooms'] for s in scores)} "
              f"({sum(s['ooms_after_a_raise'] for s in scores)}) |")
    if args.smoke:
        return 0  # too short for the goal
    return 0 if all(s["met"] for scores in results.values() for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
