"""What planning costs the daemon per job (issue 15): CPU seconds the rebalancer spends per second of a job's
training, at a given step rate, planning on every completed step (the cadence before issue 15, measured in the
same run as the baseline) and once per window (now). Below both, for scale: what storing the job's reports costs
(the API pays it either way).

A synthetic generation-bound job (batch 1 → 64 by the rules: a few changes, verdicts, then advice at the max)
writes its reports straight into a SQLite store; the changes are acknowledged at the next step, as the hook does.
Step times are simulated (1/rate each, ±5 %), so the run is as fast as the CPU allows; only the rebalancer calls
are timed (thread CPU time).

    python bench/plan_cost.py --rates 21,27 --ranks 1,2 --seconds 60
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

KNOBS = {"batch_size": {"value": 1, "min": 1, "max": 64}}


def run(rate: float, ranks: int, seconds: float, cadence: str, seed: int = 1) -> dict:
    """One simulated job on a fresh store; ``cadence`` "step" (evaluate every completed step) or "window"."""
    from trimtab.control.service import Rebalancer
    from trimtab.store import changes as change_store
    from trimtab.store import jobs as job_store
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    with tempfile.TemporaryDirectory(prefix="trimtab-plan-cost-") as tmp:
        engine = open_engine(f"sqlite:///{Path(tmp) / 'trimtab.db'}")
        migrate(engine)
        job, _ = job_store.register_job(engine, "bench", ranks, {}, ["cpu"], KNOBS, "auto", None, True)
        rb = Rebalancer(engine)
        rng = random.Random(seed)
        batch, pending = 1, []
        plan_cpu = store_cpu = 0.0
        steps = int(seconds * rate)
        for i in range(steps):
            for c in pending:  # applied at this boundary on every rank, then acknowledged
                batch = int(c.value)
                for rank in range(ranks):
                    change_store.ack_change(engine, job.id, c.id, rank, i)
            t = (1 + rng.uniform(-0.05, 0.05)) / rate
            gen = t * (0.75 - 0.004 * batch)  # generation-bound until the max batch
            for rank in range(ranks):
                t0 = time.thread_time()
                job_store.add_report(engine, job.id, dict(step=i, rank=rank, step_time_s=t, generation_s=gen,
                                                          update_s=t - gen, samples=batch))
                store_cpu += time.thread_time() - t0
                fresh = job_store.get_job(engine, "bench")  # the report route has the job at hand
                t0 = time.thread_time()
                if cadence == "step":
                    if rank == ranks - 1:  # the report that completes the step, as the old after_report
                        rb.evaluate(fresh, wait=False)
                else:
                    rb.after_report(fresh, i, t)
                plan_cpu += time.thread_time() - t0
            pending = [c for c in change_store.list_changes(engine, job.id, limit=5, offset=0) if c.status == "pending"]
        final = job_store.get_job(engine, "bench").knobs["batch_size"]["value"]
        health = rb.health()
        engine.dispose()
    return {"cadence": cadence, "rate": rate, "ranks": ranks, "steps": steps, "job_s": steps / rate,
            "plan_cpu_s": plan_cpu, "store_cpu_s": store_cpu, "evaluations": health["evaluations"],
            "changes": health["changes_queued"], "final_batch": final}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="21", help="steps per second, e.g. 5,21,27")
    ap.add_argument("--ranks", default="1", help="ranks per job, e.g. 1,2")
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds of the job's training simulated")
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting (the median is shown)")
    args = ap.parse_args()
    print("| steps/s | ranks | cadence | evaluations | planning CPU s | cores (CPU s per job-second) | "
          "storing the reports, cores | changes | final batch |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for rate in (float(r) for r in args.rates.split(",")):
        for ranks in (int(r) for r in args.ranks.split(",")):
            row = {}
            for cadence in ("step", "window"):
                runs = sorted((run(rate, ranks, args.seconds, cadence) for _ in range(args.repeat)),
                              key=lambda r: r["plan_cpu_s"])
                r = runs[len(runs) // 2]
                row[cadence] = r
                label = "every step (before)" if cadence == "step" else "per window (now)"
                print(f"| {rate:g} | {ranks} | {label} | {r['evaluations']} | {r['plan_cpu_s']:.2f} | "
                      f"{r['plan_cpu_s'] / r['job_s']:.3f} | {r['store_cpu_s'] / r['job_s']:.3f} | {r['changes']} | "
                      f"{r['final_batch']:g} |", flush=True)
            ratio = row["step"]["plan_cpu_s"] / max(row["window"]["plan_cpu_s"], 1e-9)
            print(f"|  |  | **ratio** | | | **{ratio:.1f}× less** | | | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
