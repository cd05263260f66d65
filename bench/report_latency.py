"""Does planning delay a job's step report? Report POST latency with the rebalancer idle, then while it plans every job.

Starts a real `trimtab server` (subprocess, loopback, ephemeral port, SQLite) and registers ``--jobs`` jobs (mode
off, one rank, batch/prefetch/sync knobs). Each job posts one generation-bound step report per ``1/--rate`` s,
spread evenly over the period, from an asyncio client, and acknowledges any pending change at its next step as
the hook does. Phase "idle": the jobs are in mode off, so the rebalancer plans nothing (the baseline). Then every
job is switched to auto and phase "planning" runs the same load: each report completes a window (the jobs'
own rules say a window is one step, ``window_min_s`` ≤ the step), so the rebalancer plans all of them, over and
over. Prints p50/p99/max of the report POST per phase, the plans the rebalancer made in each (from /healthz), and
the planning phase's p99 and p50 against the idle phase's (same run). The goal: p99 under 50 ms while planning.

    python bench/report_latency.py --jobs 100 --seconds 20          # the figures in BENCHMARKS.md
    python bench/report_latency.py --smoke                          # < 10 s: 10 jobs, 2 s per phase
    python bench/report_latency.py --jobs 100 --seconds 20 --burn 2 # both cores busy (issue 39: load >= 2.5)

``--burn N`` runs N CPU-bound processes at normal priority for the whole run, so the planning process (lowered in
priority) is the one the kernel leaves waiting: a plan that held SQLite's write lock while waiting held every
report's write up with it. ``--server-env K=V`` starts the server with that variable set (e.g. the switch that
brings back the old behaviour, to measure before and after in one run: ``TRIMTAB_PLAN_WRITES=child``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import multiprocessing
from contextlib import contextmanager

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.live_api import trimtab_server  # noqa: E402

GOAL_P99_MS = 50.0
KNOBS = {"batch_size": {"value": 1, "min": 1, "max": 64}, "prefetch": {"value": 0, "min": 0, "max": 8},
         "sync_every": {"value": 1, "min": 1, "max": 8}}


def job_body(name: str, step_s: float) -> dict:
    # A window is one step, a verdict a few: every report gives the rebalancer something to plan.
    controller = {"window_min_s": step_s * 0.5, "verdict_before_s": step_s * 2, "verdict_max_after_s": step_s * 2}
    return {"name": name, "ranks": 1, "device_map": {}, "hostnames": ["bench-box"], "knobs": KNOBS, "mode": "off",
            "rules": {"controller": controller}}


async def run_phase(client: httpx.AsyncClient, names: list[str], steps: dict, rate: float, seconds: float) -> dict:
    """Every job reports ``rate`` steps a second for ``seconds``; returns the report latencies (ms) and errors."""
    period_s = 1.0 / rate
    latencies: list[float] = []
    lags: list[float] = []
    errors, reasons = 0, {}
    t0 = time.monotonic()

    async def job_loop(i: int, name: str) -> None:
        nonlocal errors
        tick, pending = 0, []
        while True:
            at = t0 + (tick + i / len(names)) * period_s
            if at - t0 >= seconds:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            step = steps[name]
            for change_id in pending:  # the hook applies a change at the next step boundary, then acks
                try:
                    await client.post(f"/v1/jobs/{name}/acks", json={"change_id": change_id, "rank": 0,
                                                                     "applied_at_step": step})
                except httpx.HTTPError as exc:
                    reasons[f"ack: {type(exc).__name__}"] = reasons.get(f"ack: {type(exc).__name__}", 0) + 1
            report = {"step": step, "rank": 0, "step_time_s": period_s, "samples": 8,
                      "phases": {"generation": 0.9 * period_s, "evaluation": 0.05 * period_s,
                                 "update": 0.03 * period_s}}
            start = time.perf_counter()
            try:
                r = await client.post(f"/v1/jobs/{name}/reports", json=report)
                latencies.append((time.perf_counter() - start) * 1000)
                r.raise_for_status()
                pending = [c["change_id"] for c in r.json()["pending_changes"]]
            except httpx.HTTPError as exc:
                errors += 1
                why = f"HTTP {exc.response.status_code}: {exc.response.text[:120]}" \
                    if isinstance(exc, httpx.HTTPStatusError) else type(exc).__name__
                reasons[why] = reasons.get(why, 0) + 1
                pending = []
            steps[name] = step + 1
            tick += 1

    async def ticker() -> None:
        # How late the client's own event loop wakes up (a busy machine delays the client too, and that delay
        # would count in every latency above).
        while time.monotonic() - t0 < seconds:
            due = time.monotonic() + 0.01
            await asyncio.sleep(0.01)
            lags.append((time.monotonic() - due) * 1000)

    await asyncio.gather(ticker(), *(job_loop(i, n) for i, n in enumerate(names)))
    return {"latencies": latencies, "lags": lags, "errors": errors, "reasons": reasons,
            "wall_s": time.monotonic() - t0}


def _burn() -> None:  # a CPU-bound loop until killed
    while True:
        pass


@contextmanager
def cpu_burners(n: int):
    """``n`` processes that each keep a core busy, at normal priority, stopped at the end."""
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


def cpu_s(process: psutil.Process) -> float:
    """CPU time of ``process`` and its live children (the server's planning process)."""
    total = 0.0
    for p in [process] + (process.children(recursive=True) if process.pid != os.getpid() else []):
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def plans(base: str) -> int:
    return httpx.get(f"{base}/healthz", timeout=10).json()["components"]["rebalancer"]["evaluations"]


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def bench(base: str, token: str, server: psutil.Process, n_jobs: int, rate: float, seconds: float) -> list[dict]:
    names = [f"job{i:03d}" for i in range(n_jobs)]
    limits = httpx.Limits(max_connections=n_jobs, max_keepalive_connections=n_jobs)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30.0,
                                 limits=limits) as client:
        for name in names:
            (await client.post("/v1/jobs", json=job_body(name, 1.0 / rate))).raise_for_status()
        steps = {n: 0 for n in names}
        results = []
        for phase in ("idle", "planning"):
            if phase == "planning":
                for name in names:
                    (await client.put(f"/v1/jobs/{name}/mode", json={"mode": "auto"})).raise_for_status()
            before, cpu_before, own_before = plans(base), cpu_s(server), cpu_s(psutil.Process())
            res = await run_phase(client, names, steps, rate, seconds)
            res.update(phase=phase, plans=plans(base) - before, server_cpu_s=cpu_s(server) - cpu_before,
                       client_cpu_s=cpu_s(psutil.Process()) - own_before)
            results.append(res)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1.0, help="step reports per job per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--burn", type=int, default=0, metavar="N",
                    help="N CPU-bound processes at normal priority for the whole run (both cores busy: 2)")
    ap.add_argument("--server-env", action="append", default=[], metavar="K=V",
                    help="an environment variable for the server (repeatable)")
    ap.add_argument("--smoke", action="store_true", help="a quick run (10 jobs, 2 s per phase) that checks it works")
    args = ap.parse_args()
    if args.smoke:
        args.jobs, args.seconds = 10, 2.0
    server_env = dict(kv.split("=", 1) for kv in args.server_env)
    with tempfile.TemporaryDirectory(prefix="trimtab-report-latency-") as tmp_dir, cpu_burners(args.burn):
        tmp = Path(tmp_dir)  # the store, removed after
        with trimtab_server(f"sqlite:///{tmp}/trimtab.db", tmp / "state", env=server_env) as (base, token, pid):
            # other work on the machine shows in every figure: say how much there was (burners included)
            load_at_start = os.getloadavg()[0]
            results = asyncio.run(bench(base, token, psutil.Process(pid), args.jobs, args.rate, args.seconds))
        load_at_end = os.getloadavg()[0]
    print(f"trimtab server on SQLite{''.join(f' {k}={v}' for k, v in server_env.items())}; {args.jobs} jobs × "
          f"{args.rate:g} reports/s, {args.seconds:g} s per phase; cores: {os.cpu_count()}; CPU burners: {args.burn}")
    print(f"{'phase':>9} {'reports':>8} {'errors':>7} {'plans':>6} {'plans/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'server CPU %':>13} {'client CPU %':>13} {'client loop lag p50/p99 ms':>27}")
    for r in results:
        lat = r["latencies"]
        r["p50"], r["p99"] = pct(lat, 50), pct(lat, 99)
        print(f"{r['phase']:>9} {len(lat):>8} {r['errors']:>7} {r['plans']:>6} {r['plans'] / r['wall_s']:>8.1f} "
              f"{r['p50']:>8.1f} {r['p99']:>8.1f} {max(lat):>8.1f} {100 * r['server_cpu_s'] / r['wall_s']:>13.0f} "
              f"{100 * r['client_cpu_s'] / r['wall_s']:>13.0f} {pct(r['lags'], 50):>16.1f}/{pct(r['lags'], 99):<10.1f}")
        for why, n in r["reasons"].items():
            print(f"{'':>9} {n} × {why}")
    idle, load = results
    per_report_ms = 1000 * idle["server_cpu_s"] / max(1, len(idle["latencies"]))
    per_plan_ms = 1000 * (load["server_cpu_s"] - idle["server_cpu_s"] * load["wall_s"] / idle["wall_s"]) \
        / max(1, load["plans"])
    print(f"server CPU per report (idle phase) {per_report_ms:.1f} ms; per plan (planning phase's extra) "
          f"{per_plan_ms:.1f} ms; load average at the start {load_at_start:.1f}, at the end {load_at_end:.1f}")
    print(f"planning / idle: p50 ×{load['p50'] / idle['p50']:.2f}, p99 ×{load['p99'] / idle['p99']:.2f}")
    ok = load["p99"] < GOAL_P99_MS and load["plans"] > 0 and not (idle["errors"] or load["errors"])
    print(f"report p99 while planning {load['p99']:.1f} ms: {'under' if ok else 'NOT under'} the {GOAL_P99_MS:g} ms "
          f"goal" + ("" if load["plans"] else " (the rebalancer planned nothing: no load was measured)"))
    # The smoke run checks that the bench works (the load planned, nothing failed), not the figure: 10 jobs for
    # 2 s on a busy machine say little about p99.
    works = load["plans"] > 0 and not (idle["errors"] or load["errors"])
    return 0 if (works if args.smoke else ok) else 1


if __name__ == "__main__":
    sys.exit(main())
