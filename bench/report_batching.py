"""What does a job of very short steps pay for its reports, one POST each against batched? Unlike the reference
pipeline (steps of 0.1–1 s, where a POST always returns before the next step ends), a step here is a few ms of
pure-Python work that holds the GIL, the case where the hook's reporter thread competes with the training thread
and, one POST per step, falls behind.

One `trimtab up` for the run. For each ``--step-ms``, blocks of ``--block`` steps alternate between: no hook (the
baseline), a hook with ``report_batch_max=1`` (one POST per report) and one with the default 64 (reports that
queued while a POST was out go in one), so drift hits all three alike; each arm's backlog is posted before the
next arm starts (off the clock). Prints per arm: the mean step against the baseline's, the reporter thread's CPU
per step, the daemon's CPU per report stored (beyond what it used during the baseline's blocks: on a small machine the
server's work competes with the job for the same cores), and reports sent / dropped (a block longer than the hook's
queue, 256, shows a reporter that falls behind) / refused, and what the server stored.

    python bench/report_batching.py --step-ms 2,5,10 --rounds 4 --block 250
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import httpx

from hook_overhead import thread_cpu_s


def busy_step(seconds: float) -> None:
    """A step of pure-Python work holding the GIL (a tokenizer, a reward function, a data loader's collate)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process and its children have used so far (the daemon's: API, store,
    rebalancer, agent)."""
    import psutil

    proc = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])


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
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from trimtab.trainer import attach
    from trimtab.workload import story

    daemon = story.start_daemon(args=["--interval", "1"])
    results = []
    try:
        for step_ms in [float(s) for s in args.step_ms.split(",")]:
            tag = f"{step_ms:g}".replace(".", "p")
            hooks = {bm: attach(job=f"batching-{tag}-ms-max-{bm}", server=daemon.url, token=daemon.token,
                                knobs={"batch_size": (8, 1, 64)}, report_batch_max=bm) for bm in (1, 64)}
            times: dict[str, list[float]] = {"none": [], "1": [], "64": []}
            server_cpu_s = dict.fromkeys(times, 0.0)
            for _ in range(args.rounds):
                for arm in times:
                    hook = hooks.get(int(arm)) if arm != "none" else None
                    cpu0_s = process_cpu_s(daemon.proc.pid)
                    for _ in range(args.block):
                        t0 = time.perf_counter()
                        busy_step(step_ms / 1000.0)
                        if hook is not None:
                            hook.step_end(samples=8)
                        times[arm].append(time.perf_counter() - t0)
                    drained(hook)
                    server_cpu_s[arm] += process_cpu_s(daemon.proc.pid) - cpu0_s
            time.sleep(1.0)  # the reporters post what is still queued
            n = args.rounds * args.block
            row = {"step_ms": step_ms, "steps_per_arm": n}
            for bm, hook in hooks.items():
                cpu_s = thread_cpu_s(f"trimtab-reporter-{hook.job}")
                reporter = hook._reporter
                hook.close()
                stored = stored_reports(daemon, hook.job)
                row[str(bm)] = {
                    "mean_step_vs_no_hook": statistics.fmean(times[str(bm)]) / statistics.fmean(times["none"]),
                    "reporter_cpu_ms_per_step": None if cpu_s is None else 1e3 * cpu_s / n,
                    "server_cpu_ms_per_report": 1e3 * (server_cpu_s[str(bm)] - server_cpu_s["none"]) / max(1, stored),
                    "sent": reporter.sent, "dropped": reporter.dropped, "refused": reporter.rejected,
                    "stored": stored}
            results.append(row)
            for bm in ("1", "64"):
                r = row[bm]
                cpu = "n/a" if r["reporter_cpu_ms_per_step"] is None else f"{r['reporter_cpu_ms_per_step']:.3f} ms"
                print(f"steps of {step_ms:g} ms, report_batch_max {bm:>2}: mean step "
                      f"{100 * (r['mean_step_vs_no_hook'] - 1):+.1f} % against no hook; reporter CPU {cpu} a step, the "
                      f"server's {r['server_cpu_ms_per_report']:.2f} ms a report; "
                      f"{r['sent']} of {row['steps_per_arm']} reports sent, {r['dropped']} dropped, "
                      f"{r['refused']} refused, {r['stored']} stored", flush=True)
    finally:
        daemon.close(False)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
