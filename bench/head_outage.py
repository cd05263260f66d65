"""A head outage against a hooked loop: is any step report lost, stored twice, or miscounted?

A real `trimtab server` (a child process on loopback, SQLite in a temporary directory) and, in this process, a
hooked CPU loop at ``--steps-per-s`` (default 20). After ``--warm-s`` the server is stopped with SIGSTOP for
``--outage-s`` (the process freezes: its port still accepts connections, nothing answers, every POST times out —
the worst case for the hook, which cannot tell what was stored), then SIGCONT. The loop runs ``--after-s`` more,
stops, and the hook gets ``--drain-s`` to send what waits before it closes. Printed (JSON, and one summary line):

* steps run, reports stored (distinct steps in the store), duplicated rows, steps missing;
* the hook's counters (``hook.stats``) against that truth: sent == stored, submitted == steps run,
  submitted + inherited == sent + rejected + dropped + unconfirmed + pending + left;
* this process's RSS before the outage and at its peak, and the spool's bytes on disk at the peak (sampled every
  0.5 s, and the hook's own peak);
* how long after SIGCONT the hook had caught up (at most half a second of steps waiting: the backlog sent, paced);
* the step rate reached (a loaded machine may not hold ``--steps-per-s``) and ``step_end``'s cost (p50, p99, max)
  before, during and after the outage;
* the stored step times against the loop's own (its wall clock as ``step_end`` returned), per phase: the time the
  controller reads, the report's ``ended_ms`` (the hook's stamp), and the arrival time ``received_ms`` (what it
  read before ``ended_ms``: the baseline, in the same run) — p50 and max of |stored − own|, seconds.

    python bench/head_outage.py --outage-s 600                 # the figure
    python bench/head_outage.py --outage-s 30 --spool-max-bytes 0   # memory only (the hook before the spool)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import psutil
from live_api import trimtab_server


def stored_steps(db: Path, job: str) -> tuple[int, int, set[int]]:
    """(rows, distinct steps, the steps) of ``job`` in the store."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT r.step FROM job_reports r JOIN jobs j ON j.id = r.job_id WHERE j.name = ?",
                            (job,)).fetchall()
    steps = [r[0] for r in rows]
    return len(steps), len(set(steps)), set(steps)


def stored_times(db: Path, job: str) -> dict[int, tuple[int, Optional[int]]]:
    """step → (received_ms, ended_ms) of ``job``'s reports (one rank)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT r.step, r.received_ms, r.ended_ms FROM job_reports r JOIN jobs j "
                            "ON j.id = r.job_id WHERE j.name = ?", (job,)).fetchall()
    return {step: (received, ended) for step, received, ended in rows}


def time_errors(own_ms: dict[int, int], stored: dict[int, tuple[int, Optional[int]]], phase_of: dict[int, str]):
    """Per phase: p50 and max of |stored − own| in seconds, for ended_ms (COALESCE'd with received_ms, as the
    controller reads it) and for received_ms alone."""
    out: dict[str, dict] = {}
    for phase in ("warm", "outage", "after"):
        steps = [k for k, p in phase_of.items() if p == phase and k in stored]
        for name, pick in (("ended_ms", lambda r: r[1] if r[1] is not None else r[0]), ("received_ms", lambda r: r[0])):
            errors = sorted(abs(pick(stored[k]) - own_ms[k]) / 1000 for k in steps)
            out.setdefault(phase, {})[name] = ({"p50": round(errors[len(errors) // 2], 3),
                                                "max": round(errors[-1], 3)} if errors else {})
    return out


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


class Peaks(threading.Thread):
    """Samples this process's RSS and the spool directory's bytes every ``every_s`` until stopped; while
    ``watching`` also whether the server is still stopped (``server_running_samples``: the samples that found it
    running, 0 in an outage that held)."""

    def __init__(self, spool_dir: Path, server_pid: int, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.spool_dir, self.every_s = spool_dir, every_s
        self.rss_peak = self.disk_peak = 0
        self.watching = False  # set before SIGSTOP is sent, cleared before SIGCONT
        self.server_running_samples = 0
        self._stop_evt = threading.Event()
        self._me, self._server = psutil.Process(), psutil.Process(server_pid)

    def run(self) -> None:
        while not self._stop_evt.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        self.rss_peak = max(self.rss_peak, self._me.memory_info().rss)
        self.disk_peak = max(self.disk_peak, dir_bytes(self.spool_dir))
        if self.watching:
            status = self._server.status()
            self.server_running_samples += self.watching and status != psutil.STATUS_STOPPED

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()
        self.sample()


def quantiles_ms(costs: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``step_end``'s cost, in ms."""
    if not costs:
        return {}
    ordered = sorted(costs)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(at(0.5) * 1000, 3), "p99": round(at(0.99) * 1000, 3), "max": round(ordered[-1] * 1000, 3)}


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outage-s", type=float, default=600.0, help="how long the server stays stopped (SIGSTOP)")
    ap.add_argument("--steps-per-s", type=float, default=20.0)
    ap.add_argument("--busy-ms", type=float, default=5.0, help="CPU work in each step (the rest is sleep)")
    ap.add_argument("--warm-s", type=float, default=10.0, help="steps before the outage")
    ap.add_argument("--after-s", type=float, default=20.0, help="steps after SIGCONT")
    ap.add_argument("--drain-s", type=float, default=120.0, help="the most the hook gets to send its backlog")
    ap.add_argument("--queue-max", type=int, default=256)
    ap.add_argument("--spool-max-bytes", type=int, default=None, help="the spool's bound (0: memory only)")
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    args = ap.parse_args()

    from trimtab.trainer import attach

    with tempfile.TemporaryDirectory(prefix="head-outage-") as tmp_name, \
            trimtab_server(f"sqlite:///{Path(tmp_name) / 'trimtab.db'}", Path(tmp_name) / "state",
                           own_session=True) as (url, token, pid):
        tmp = Path(tmp_name)
        spool_dir, db = tmp / "hook-spool", tmp / "trimtab.db"
        job = "outage"
        options = {"queue_max": args.queue_max, "spool_dir": str(spool_dir)}
        if args.spool_max_bytes is not None:
            options["spool_max_bytes"] = args.spool_max_bytes
        hook = attach(job, url, token, knobs={"batch_size": (8, 1, 64)}, **options)
        peaks = Peaks(spool_dir, pid)
        step_s = 1.0 / args.steps_per_s
        busy_s = min(args.busy_ms / 1000.0, step_s)
        steps = 0
        caught_up = max(1, int(args.steps_per_s / 2))  # reports waiting once the backlog is sent: ≤ 0.5 s of steps
        step_end_s: dict[str, list[float]] = {}
        t_start = time.monotonic()
        rss_before = 0
        marks: dict[str, float] = {}
        own_ms: dict[int, int] = {}  # step → the loop's wall clock as its step_end returned
        phase_of: dict[int, str] = {}
        try:
            for phase, length_s in (("warm", args.warm_s), ("outage", args.outage_s), ("after", args.after_s)):
                if phase == "outage":
                    rss_before = psutil.Process().memory_info().rss
                    os.kill(pid, signal.SIGSTOP)
                    peaks.watching = True
                    peaks.start()
                marks[phase] = time.monotonic()
                costs = step_end_s.setdefault(phase, [])
                until = time.monotonic() + length_s
                next_t = time.monotonic()
                while time.monotonic() < until:
                    busy(busy_s)
                    t0 = time.perf_counter()
                    hook.step_end(samples=hook.knobs["batch_size"])
                    costs.append(time.perf_counter() - t0)
                    own_ms[steps], phase_of[steps] = time.time_ns() // 1_000_000, phase
                    steps += 1
                    if phase == "after" and "drained" not in marks and hook.stats["pending"] <= caught_up:
                        marks["drained"] = time.monotonic()
                    next_t += step_s
                    time.sleep(max(0.0, next_t - time.monotonic()))
                if phase == "outage":
                    peaks.watching = False
                    os.kill(pid, signal.SIGCONT)
                    marks["resumed"] = time.monotonic()
            run_s = time.monotonic() - t_start
            deadline = time.monotonic() + args.drain_s
            while hook.stats["pending"] and time.monotonic() < deadline:
                time.sleep(0.2)
            drained_s = marks.get("drained", time.monotonic()) - marks["resumed"]
            hook.close(timeout_s=5.0)
        finally:
            os.kill(pid, signal.SIGCONT)
            if peaks.is_alive():
                peaks.stop()
        time.sleep(1.0)  # requests the stopped server had buffered are answered by now
        rows, distinct, got = stored_steps(db, job)
        s = hook.stats
        counted = s["sent"] + s["rejected"] + s["dropped"] + s["unconfirmed"] + s["pending"] + s["left"]
        result = {
            "outage_s": args.outage_s, "steps_per_s_asked": args.steps_per_s,
            "steps_per_s_run": round(steps / run_s, 2), "steps_run": steps, "stored": distinct,
            "duplicated_rows": rows - distinct, "missing": steps - len(got & set(range(steps))),
            "drained_s_after_sigcont": round(drained_s, 1),
            "hook": {k: s[k] for k in ("submitted", "inherited", "sent", "stored", "already_stored", "late",
                                       "rejected", "dropped", "dropped_by", "unconfirmed", "pending", "left", "spooled",
                                       "spool_bytes_peak", "spool_errors")},
            "counters_exact": {  # the unconfirmed may or may not be in the store: the one count the hook cannot know
                "sent <= stored <= sent + unconfirmed": s["sent"] <= distinct <= s["sent"] + s["unconfirmed"],
                "submitted == steps run": s["submitted"] == steps,
                "submitted+inherited == sent+rejected+dropped+unconfirmed+pending+left":
                    s["submitted"] + s["inherited"] == counted},
            # something else woke the server (a SIGCONT not ours): the outage was shorter than asked, no figure
            "outage_held": peaks.server_running_samples == 0,
            "server_running_samples_in_outage": peaks.server_running_samples,
            "rss_mb_before_outage": round(rss_before / 2**20, 1), "rss_mb_peak": round(peaks.rss_peak / 2**20, 1),
            "spool_disk_bytes_peak": peaks.disk_peak,
            "step_end_ms": {phase: quantiles_ms(costs) for phase, costs in step_end_s.items()},
            "stored_time_error_s": time_errors(own_ms, stored_times(db, job), phase_of),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"outage {args.outage_s:g} s at {result['steps_per_s_run']} steps/s: {steps} steps run, {distinct} stored, "
          f"{rows - distinct} duplicated, {result['missing']} missing; hook sent {s['sent']}, dropped {s['dropped']}, "
          f"unconfirmed {s['unconfirmed']}; RSS {result['rss_mb_before_outage']} -> {result['rss_mb_peak']} MB, "
          f"spool peak {peaks.disk_peak} bytes; outage steps' stored time off the loop's by max "
          f"{result['stored_time_error_s']['outage']['ended_ms'].get('max')} s (ended_ms) against "
          f"{result['stored_time_error_s']['outage']['received_ms'].get('max')} s (arrival)", file=sys.stderr)
    if not result["outage_held"]:
        print(f"the server was found running {peaks.server_running_samples} times during the outage (woken by a "
              f"SIGCONT not sent here): the outage did not hold, these figures are not an outage's", file=sys.stderr)
    return 0 if all(result["counters_exact"].values()) and result["outage_held"] else 1


if __name__ == "__main__":
    sys.exit(main())
