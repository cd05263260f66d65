"""Step composition on a GPU: is the phase trimtab grades the phase the GPU spent its time in?

Two loops of three phases of known GPU duration — generation 20 %, evaluation 60 %, update 20 % of the step (each a
calibrated ``torch.cuda._sleep``: the GPU busy for a set time, whatever the host does) — through the hook to a live
`trimtab up` (its own SQLite store, the rebalancer in advise mode):

* ``sync``: every phase ends in a host sync (wall time and GPU time agree);
* ``async``: evaluation launches its kernels and returns (scores stay on the GPU); the update's ``loss.item()``
  waits — on wall time evaluation takes 0 % and the update 80 %.

Prints, per loop, the planned shares, the shares the store holds on GPU time and on wall time, what
`trimtab check` says and the rebalancer's decision (with the time base in its evidence). Goal: stored GPU shares
within 2 points of the planned ones, and check naming evaluation in both loops. Needs CUDA;
``--smoke`` (CPU, < 10 s) runs the same loops with the hook standalone and grades its reports in-process (wall
time: no CUDA, no GPU time — the plumbing only).

    python bench/gpu_phases.py --steps 120 --json gpu_phases.json
    python bench/gpu_phases.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional

PLAN = {"generation": 0.2, "evaluation": 0.6, "update": 0.2}
PHASES = tuple(PLAN)
LOOPS = ("sync", "async")


class GpuBusy:
    """Keeps the current stream busy for a set time: ``torch.cuda._sleep`` spins for a number of GPU cycles,
    calibrated here with CUDA events (median of a few runs)."""

    def __init__(self, torch):
        self.torch = torch
        self.cycles_per_s = self.calibrate()

    def calibrate(self, cycles: int = 20_000_000, runs: int = 5) -> float:
        torch = self.torch
        rates = []
        for _ in range(runs):
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
            torch.cuda._sleep(cycles)
            ev1.record()
            ev1.synchronize()
            rates.append(cycles / (ev0.elapsed_time(ev1) / 1000.0))
        return statistics.median(rates)

    def __call__(self, seconds: float) -> None:
        self.torch.cuda._sleep(int(seconds * self.cycles_per_s))


def make_step(loop: str, step_s: float, torch, busy: Optional[GpuBusy]) -> Callable[[Any], None]:
    """One training step of ``loop`` through ``hook``: three phases of PLAN × ``step_s`` GPU seconds each. Without
    CUDA (``busy`` None) each phase sleeps on the host instead (smoke: wall time only)."""
    gen_s, eval_s, upd_s = (PLAN[p] * step_s for p in PHASES)
    if busy is None:
        def cpu_step(hook) -> None:
            for name, seconds in zip(PHASES, (gen_s, eval_s, upd_s)):
                with hook.phase(name):
                    time.sleep(seconds)
        return cpu_step
    x = torch.ones(256, device="cuda")

    def gpu_step(hook) -> None:
        with hook.phase("generation"):
            busy(gen_s)
            torch.cuda.synchronize()
        with hook.phase("evaluation"):
            busy(eval_s)
            scores = x * 2.0  # stays on the GPU
            if loop == "sync":
                torch.cuda.synchronize()
        with hook.phase("update"):
            busy(upd_s)
            loss = (scores + x).sum()
            loss.item()  # waits for everything queued: in "async", evaluation's kernels too
    return gpu_step


def run_loop(hook, step: Callable[[Any], None], steps: int, warmup: int) -> list:
    """Runs ``warmup`` + ``steps`` steps; returns the hook's report objects of the measured steps (their GPU time
    is filled in as their events resolve, so read them after ``hook.close()``)."""
    reports = []
    for i in range(warmup + steps):
        step(hook)
        hook.step_end(samples=8)
        if i >= warmup:
            reports.append(hook.last_report)
    return reports


def shares(rows: list[dict], gpu: bool) -> dict[str, Optional[float]]:
    """Each phase's seconds over the steps' seconds, % (GPU: the gpu_<phase>_s columns); None where absent."""
    total = sum(r["step_time_s"] for r in rows)
    out: dict[str, Optional[float]] = {}
    for p in PHASES:
        values = [r.get(f"gpu_{p}_s" if gpu else f"{p}_s") for r in rows]
        out[p] = None if all(v is None for v in values) or total <= 0 else \
            100.0 * sum(v or 0.0 for v in values) / total
    return out


def _fmt(s: dict[str, Optional[float]]) -> str:
    return " / ".join("n/a" if v is None else f"{v:.1f}" for v in s.values())


def smoke(steps: int, step_s: float) -> int:
    """CPU: the loops through a standalone hook, the reports graded in-process as the server would grade them."""
    import torch

    from trimtab.contract.step_report import to_columns
    from trimtab.grading.grading import job_rows
    from trimtab.grading.rules import default_rules
    from trimtab.grading.signals import JobContext
    from trimtab.grading.window import fold_step, throughput
    from trimtab.trainer import attach

    cuda = torch.cuda.is_available()
    busy = GpuBusy(torch) if cuda else None
    if cuda:
        torch.cuda.init()
    for loop in LOOPS:
        hook = attach(job=f"gpu-phases-{loop}", server=None)
        reports = run_loop(hook, make_step(loop, step_s, torch, busy), steps, warmup=2)
        hook.close()
        rows = []
        for r in reports:
            row = to_columns(r.to_wire())
            row["received_ms"] = int(time.time() * 1000)
            rows.append(row)
        win = [fold_step(row["step"], [row]) for row in rows]
        comp = job_rows(default_rules(), win, JobContext(all_steps=win, probe_baseline_us=None), throughput(win),
                        None)[0]
        print(f"{loop:>5}: wall {_fmt(shares(rows, False))}  gpu {_fmt(shares(rows, True))}  "
              f"check: {comp.status} — {comp.message}")
    print("smoke ok (CPU: wall time only)" if not cuda else "smoke ok")
    return 0


def _get(client, path: str, **params) -> Any:
    r = client.get(path, params=params)
    r.raise_for_status()
    return r.json()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=120, help="measured steps per loop (the window needs ≥ 4 s)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=50.0, help="planned GPU time of a step, ms")
    ap.add_argument("--tolerance-pts", type=float, default=2.0)
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check, < 10 s, no daemon")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="the full flow (daemon, store, check) without CUDA: host sleeps, wall time only — checks the "
                         "plumbing, not the figures (exit 1: no GPU time)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.smoke:
        return smoke(steps=20, step_s=0.01)

    import httpx
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_dry_run:
        print("gpu_phases: needs CUDA (phases of known GPU duration); --smoke runs the CPU plumbing check",
              file=sys.stderr)
        return 2
    from trimtab.trainer import attach
    from trimtab.workload.story import start_daemon

    busy = None
    if cuda:
        torch.cuda.init()
        busy = GpuBusy(torch)
    print(f"device {torch.cuda.get_device_name() if cuda else 'CPU (dry run)'} | _sleep calibrated at "
          f"{busy.cycles_per_s / 1e9 if busy else 0:.3f} Gcycles/s | "
          f"step {args.step_ms:g} ms planned: generation/evaluation/update "
          + " / ".join(f"{100 * v:.0f}" for v in PLAN.values()) + " %")
    daemon = start_daemon()
    results: dict[str, Any] = {"plan_pct": {p: 100 * v for p, v in PLAN.items()}, "loops": {}}
    ok = True
    try:
        headers = {"Authorization": f"Bearer {daemon.token}"}
        with httpx.Client(base_url=daemon.url, headers=headers, timeout=10.0) as client:
            for loop in LOOPS:
                job = f"gpu-phases-{loop}"
                if busy is not None:
                    busy.cycles_per_s = busy.calibrate()
                hook = attach(job=job, server=daemon.url, token=daemon.token, mode="advise",
                              device_map={"actor": [torch.cuda.current_device() if cuda else 0]},
                              knobs={"batch_size": (8, 1, 64), "prefetch": (0, 0, 4)})
                step = make_step(loop, args.step_ms / 1000.0, torch, busy)
                t0 = time.perf_counter()
                reports = run_loop(hook, step, args.steps, args.warmup)
                loop_s = time.perf_counter() - t0
                hook.close(timeout_s=10.0)
                hook_rows = [{"step_time_s": r.step_time_s, **{f"{p}_s": r.phases_s.get(p) for p in PHASES},
                              **{f"gpu_{p}_s": r.gpu_phases_s.get(p) for p in PHASES}} for r in reports]
                measured = {r.step for r in reports}
                deadline = time.monotonic() + 20
                while True:
                    stored = [r for r in _get(client, f"/v1/jobs/{job}/reports", limit=1000)["reports"]
                              if r["step"] in measured]
                    if len(stored) >= len(measured) or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                decision = None
                deadline = time.monotonic() + 15
                while decision is None and time.monotonic() < deadline:
                    found = _get(client, "/v1/decisions", job=job)["decisions"]
                    decision = found[0] if found else None
                    if decision is None:
                        time.sleep(0.5)
                balance = _get(client, "/v1/balance/jobs")
                summary = next(j for j in balance["jobs"] if j["name"] == job)
                comp = next(v for v in summary["verdicts"] if v["check"] == "step_composition")
                gpu, wall = shares(stored, True), shares(stored, False)
                within = all(gpu[p] is not None and abs(gpu[p] - 100 * PLAN[p]) <= args.tolerance_pts
                             for p in PHASES)
                names_eval = comp["message"].startswith("evaluation-bound")
                ok &= within and names_eval
                evidence = (decision or {}).get("evidence") or {}
                results["loops"][loop] = {
                    "steps_stored": len(stored), "loop_s": loop_s, "mean_step_s": statistics.fmean(
                        r["step_time_s"] for r in stored) if stored else None,
                    "stored_gpu_pct": gpu, "stored_wall_pct": wall, "hook_gpu_pct": shares(hook_rows, True),
                    "within_tolerance": within, "check_status": comp["status"], "check_message": comp["message"],
                    "time_base": summary.get("time_base"),
                    "decision_rule": (decision or {}).get("rule"),
                    "decision_time_base": (evidence.get("reading") or evidence).get("time_base")
                    if isinstance(evidence, dict) else None}
                res = results["loops"][loop]
                print(f"\n[{loop}] {len(stored)} steps stored, mean step {1000 * (res['mean_step_s'] or 0):.2f} ms")
                print(f"  planned          gen/eval/update %: {_fmt({p: 100 * v for p, v in PLAN.items()})}")
                print(f"  stored GPU time  gen/eval/update %: {_fmt(gpu)}  (within {args.tolerance_pts:g} pts: "
                      f"{'yes' if within else 'NO'})")
                print(f"  hook's events    gen/eval/update %: {_fmt(res['hook_gpu_pct'])}")
                print(f"  stored wall time gen/eval/update %: {_fmt(wall)}")
                print(f"  check (/v1/balance/jobs, time_base {res['time_base']}): {comp['status']} — "
                      f"{comp['message']}")
                print(f"  rebalancer decision: {res['decision_rule']} (evidence time_base "
                      f"{res['decision_time_base']})")
        env = {**os.environ, "TRIMTAB_TOKEN": daemon.token}
        out = subprocess.run([sys.executable, "-m", "trimtab.cli.main", "check", "--server", daemon.url],
                             env=env, capture_output=True, text=True, timeout=60)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("job ") or "step_composition" in ln
                 or "on wall time:" in ln]
        print("\n`trimtab check --server …` (exit %d), the job lines:" % out.returncode)
        print("\n".join("  " + ln for ln in lines))
        results["check_lines"] = lines
    finally:
        daemon.stop()
    results["ok"] = ok
    print(f"\nresult: {'OK' if ok else 'FAILED'} (GPU shares within {args.tolerance_pts:g} pts of the plan and "
          f"check naming evaluation in both loops)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
