"""What does a job of very short steps pay for its reports, one POST each against batched? Unlike the reference
pipeline (steps of 0.1–1 s, where a POST always returns before the next step ends), a step here is a few ms of
pure-Python work that holds the GIL, the case where the hook's reporter thread competes with the training thread
and, one POST per step, falls behind.

One `trimtab up` for the run. For each ``--step-ms``, blocks of ``--block`` steps alternate between no hook (the
baseline) and the hooks of ``ARMS`` (one POST per report; batched; paced at 50 ms; paced, the default), so drift hits
them alike; each arm's backlog is posted before the next arm starts (off the clock). Each hook first runs
``--warm-up`` steps off the clock: its start-up (registration, the HTTP client's imports, the connection) is a
one-time cost, printed apart, not a per-step one. Prints per arm: the mean step against the baseline's, the reporter
thread's CPU per step, the daemon's CPU per report stored (beyond what it used during the baseline's blocks: on a
small machine the server's work competes with the job for the same cores), and reports sent / dropped (a block
longer than the hook's queue, 256, shows a reporter that falls behind) / refused, and what the server stored.

    python bench/report_batching.py --step-ms 2,5,10 --rounds 4 --block 250
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import httpx

import psutil
from hook_overhead import thread_cpu_s
from report_latency import cpu_s as process_cpu_s  # a process's CPU time and its live children's


# How the hook reports, arm by arm: one POST per report as fast as the server answers (the hook before batching),
# the reports that queued while a POST was out in one (batching alone), POSTs at least 50 ms apart (the default
# before), and the default: batched, POSTs at least report_min_interval_s (250 ms) apart, so reports of steps
# shorter than that go together.
ARMS = {"one POST each": {"report_batch_max": 1, "report_min_interval_s": 0.0},
        "batched": {"report_batch_max": 64, "report_min_interval_s": 0.0},
        "paced 50 ms": {"report_min_interval_s": 0.05},
        "paced (default)": {}}


def busy_step(seconds: float) -> None:
    """A step of pure-Python work holding the GIL (a tokenizer, a reward function, a data loader's collate)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def pin(daemon_pid: int) -> None:
    """This process on CPU 0, the daemon and its children on the rest (needs two CPUs or more)."""
    import os

    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs or more")
    os.sched_setaffinity(0, cpus[:1])
    for p in [psutil.Process(daemon_pid), *psutil.Process(daemon_pid).children(recursive=True)]:
        p.cpu_affinity(cpus[1:])


def drained(hook, limit_s: float = 5.0) -> None:
    """Waits (off the clock) until ``hook``'s reporter has posted what queued, so one arm's backlog is not posted
    during the next arm's steps."""
    deadline = time.monotonic() + limit_s
    while hook is not None and hook._reporter.queued and time.monotonic() < deadline:
        time.sleep(0.01)


def stored_reports(daemon, job: str) -> int:
    """How many of ``job``'s reports the server stored (paging through GET …/reports)."""
    n, offset = 0, 0
    with httpx.Client(base_url=daemon.url, timeout=10.0) as http:
        while offset is not None:
            page = http.get(f"/v1/jobs/{job}/reports", params={"limit": 500, "offset": offset}).json()
            n += len(page["reports"])
            offset = page.get("next_offset")
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--step-ms", default="2,5,10", help="step lengths to try, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=250, help="steps per arm per round")
    ap.add_argument("--warm-up", type=int, default=300,
                    help="steps each hook runs before the clocked rounds (not counted): its start-up — the first "
                         "registration, the HTTP client's imports and connection — is printed apart")
    ap.add_argument("--pin", action="store_true",
                    help="the job on CPU 0, the daemon on the others (as on a GPU node, where it has cores of its "
                         "own): the hook's cost apart from the daemon's competition for the job's core")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from trimtab.trainer import attach
    from trimtab.workload import story

    daemon = story.start_daemon(args=["--interval", "1"])
    daemon_proc = psutil.Process(daemon.proc.pid)  # the daemon's CPU: API, store, rebalancer, agent
    if args.pin:
        pin(daemon.proc.pid)
    results = []
    try:
        for step_ms in [float(s) for s in args.step_ms.split(",")]:
            tag = f"{step_ms:g}".replace(".", "p")
            hooks = {arm: attach(job=f"batching-{tag}-ms-{i}", server=daemon.url, token=daemon.token,
                                 knobs={"batch_size": (8, 1, 64)}, **options)
                     for i, (arm, options) in enumerate(ARMS.items())}
            start_cpu_s, warm_stored, warm_sent, warm_dropped = {}, {}, {}, {}
            for arm, hook in hooks.items():  # start-up, off the clock: one-time costs are not per-step costs
                for _ in range(args.warm_up):
                    busy_step(step_ms / 1000.0)
                    hook.step_end(samples=8)
                drained(hook)
                start_cpu_s[arm] = thread_cpu_s(f"trimtab-reporter-{hook.job}")
                warm_stored[arm], warm_sent[arm] = stored_reports(daemon, hook.job), hook._reporter.sent
                warm_dropped[arm] = hook._reporter.dropped
            times: dict[str, list[float]] = {"none": [], **{arm: [] for arm in ARMS}}
            server_cpu_s = dict.fromkeys(times, 0.0)
            for _ in range(args.rounds):
                for arm in times:
                    hook = hooks.get(arm)
                    cpu0_s = process_cpu_s(daemon_proc)
                    for _ in range(args.block):
                        t0 = time.perf_counter()
                        busy_step(step_ms / 1000.0)
                        if hook is not None:
                            hook.step_end(samples=8)
                        times[arm].append(time.perf_counter() - t0)
                    drained(hook)
                    server_cpu_s[arm] += process_cpu_s(daemon_proc) - cpu0_s
            time.sleep(1.0)  # the reporters post what is still queued
            n = args.rounds * args.block
            row = {"step_ms": step_ms, "steps_per_arm": n}
            for arm, hook in hooks.items():
                cpu_s, start_s = thread_cpu_s(f"trimtab-reporter-{hook.job}"), start_cpu_s[arm]
                cpu_s = None if cpu_s is None or start_s is None else cpu_s - start_s
                reporter = hook._reporter
                hook.close()
                stored = stored_reports(daemon, hook.job) - warm_stored[arm]
                row[arm] = {
                    "mean_step_vs_no_hook": statistics.fmean(times[arm]) / statistics.fmean(times["none"]),
                    "reporter_cpu_ms_per_step": None if cpu_s is None else 1e3 * cpu_s / n,
                    "reporter_start_cpu_ms": None if start_s is None else 1e3 * start_s,
                    "server_cpu_ms_per_report": 1e3 * (server_cpu_s[arm] - server_cpu_s["none"]) / max(1, stored),
                    "sent": reporter.sent - warm_sent[arm],
                    "dropped": reporter.dropped - warm_dropped[arm], "refused": reporter.rejected,
                    "stored": stored}
                r = row[arm]
                cpu = "n/a" if r["reporter_cpu_ms_per_step"] is None else f"{r['reporter_cpu_ms_per_step']:.3f} ms"
                print(f"steps of {step_ms:g} ms, {arm:<15}: mean step {100 * (r['mean_step_vs_no_hook'] - 1):+.1f} % "
                      f"against no hook; reporter CPU {cpu} a step, the server's "
                      f"{r['server_cpu_ms_per_report']:.2f} ms a report stored; {r['sent']} of {n} reports sent, "
                      f"{r['dropped']} dropped, {r['refused']} refused, {r['stored']} stored (after {args.warm_up} "
                      f"warm-up steps; their reporter CPU {r['reporter_start_cpu_ms'] or 0:.0f} ms)", flush=True)
            results.append(row)
    finally:
        daemon.close(False)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
