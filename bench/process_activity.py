"""Does the agent attribute a GPU's time to the right process? Two processes on one GPU against their own totals
(issue 40, item 1; H200 check).

Two child processes share GPU ``--gpu``: a **generation**-like loop (bursts of many 2048² bf16 matmuls) and a
**reward**-like loop (shorter bursts of 4096² matmuls), taking turns through a lock so their bursts never overlap
(as an RL pipeline's phases; two contexts running at once would time-slice, and each one's events would count the
other's time too). Each times its own GPU-busy time with CUDA events around each burst, with the burst's wall
start and end. ``--idle-s`` stops both for that long mid-run (reads that find nobody busy: NVML answers NOT_FOUND).
Meanwhile this script runs the agent's NVML source (``NvmlSource``: 1 s ticks, process rows every 5 s, and its own
thread reading per-process utilization every ``--activity-every`` s, off the tick) and, apart from it, reads NVML's
raw per-process records every tick to estimate the driver's sampling period (a low percentile of the gaps between
distinct record times: the driver samples on a grid) and for the estimators below.

Printed, per process, its own CUDA-event busy seconds and, side by side, each estimator of it as a ratio to them
(goal: within 5 %):

* **(a) agent**: the agent's attribution, through its own code (the source's process rows, summed as the store
  sums them and turned into a busy % by the ledger's estimator, ``trimtab.grading.ledger.shares``): Σ over the
  process's rows of ``sm_util_pct / 100 × (util_to_ms − util_from_ms)`` — each NVML record's smUtil × the seconds
  it covers. Its truth is the process's own busy seconds over exactly the intervals its rows cover (the first
  row's starts at the baseline read, which may be before the process's first burst);
* **(b) share × device util**: per tick interval, the process's share of the summed per-process smUtil of the raw
  records read at that tick × the device's own utilization (``nvmlDeviceGetUtilizationRates.gpu`` read at the
  tick) × the interval's wall time; **(b′)** the same with the mean of the device's utilization samples over the
  interval (``nvmlDeviceGetSamples``) instead of the one reading;
* **(c) sm × dt**: each raw record's smUtil × the time since the previous record's timestamp on the GPU (any
  process's); **(c′)** since the same process's previous record.

* **(d) the driver's rule**: NVML credits each 200 ms device sample whole to the process that ran last before it
  (measured: ``driver_rule``); applied to the processes' true bursts and the device's own samples, it is the best
  any reader of the per-process records can do, so (a) is judged against it as well as against the truth.

(b), (b′), (c), (c′) and (d) are over the raw records' span, their truths cut to it. And the raw numbers: records per
call (median, max), the sampling period, the device utilization's mean over the ticks, the way the agent picked to
read the records and what each way cost at the pick. Progress lines go to stderr, flushed. Exit 0 when the agent's
attribution (a) is within the goal for both processes, 1 outside it, 2 where it cannot run (no CUDA GPU, no NVML,
per-process utilization unsupported: one line says which). Runs unattended in under 90 s with the defaults (30 s of
loops; the children's start, torch's import and a calibration, ~15 s on an H100); ``--seconds 60`` in under 2 min.

    python3 bench/process_activity.py [--gpu 0] [--seconds 30] [--activity-every 1] [--idle-s 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.process_estimators import driver_rule, own_busy_s, share_times_util, sm_times_dt  # noqa: E402

GOAL = 0.05
LOOPS = {  # kind → (matrix side, burst ms, gap s after a burst, extra GiB held so the two differ in memory)
    "generation": (2048, 300.0, 0.15, 3),
    "reward": (4096, 120.0, 0.35, 1),
}


def _src_on_path() -> None:
    src = Path(__file__).resolve().parents[1] / "src"
    if src.is_dir() and str(src) not in sys.path:
        sys.path.insert(0, str(src))


def loop(kind: str, gpu: int, seconds: float, idle_s: float, lock, ready, go, results, scale: float = 1.0,
         shape: Optional[tuple] = None) -> None:
    """One child: calibrate a burst, then take turns with the other until ``seconds`` pass, idle for ``idle_s``
    from the middle on; send its bursts. ``scale`` stretches its burst and gap (phases of seconds, as an RL step's)."""
    import torch

    side, burst_ms, gap_s, extra_gib = shape or LOOPS[kind]
    burst_ms, gap_s = burst_ms * scale, gap_s * scale
    torch.cuda.set_device(gpu)
    a = torch.randn(side, side, device="cuda", dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    held = torch.empty(extra_gib << 30, dtype=torch.uint8, device="cuda")  # noqa: F841 - tells the two apart
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(20):
        torch.mm(a, b, out=c)
    start.record()
    for _ in range(50):
        torch.mm(a, b, out=c)
    end.record()
    end.synchronize()
    reps = max(1, int(burst_ms / (start.elapsed_time(end) / 50)))
    ready.set()
    go.wait()
    began = time.time()
    bursts, until, pause = [], began + seconds, (began + seconds / 2, began + seconds / 2 + idle_s)
    while time.time() < until:
        if pause[0] <= time.time() < pause[1]:
            time.sleep(0.05)
            continue
        with lock:
            wall_start = time.time()
            start.record()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            end.record()
            end.synchronize()
            bursts.append((wall_start, time.time(), start.elapsed_time(end) / 1000.0))
        time.sleep(gap_s)
    results.put((kind, os.getpid(), bursts))


def _mean(values) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def fail(message: str) -> int:
    print(f"process_activity: {message}", file=sys.stderr, flush=True)
    return 2


def progress(message: str) -> None:
    print(f"process_activity: {message}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="the GPU (NVML and CUDA index) both processes share")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the two loops run (rows come every 5 s)")
    ap.add_argument("--interval", type=float, default=1.0, help="the agent's tick, seconds")
    ap.add_argument("--activity-every", type=float, default=None,
                    help="the agent's per-process utilization reads, seconds (default: the agent's own, "
                         "ACTIVITY_EVERY_S)")
    ap.add_argument("--idle-s", type=float, default=0.0,
                    help="both loops idle this long from the middle of --seconds on (NVML answers NOT_FOUND)")
    ap.add_argument("--burst-scale", type=float, default=1.0,
                    help="stretch both loops' bursts and gaps by this factor (1: 300/120 ms bursts, sub-second turns)")
    ap.add_argument("--reward-side", type=int, default=None,
                    help="the reward loop's matrix side (default 4096; 2048 gives both loops the same kernel, to tell "
                         "a kernel's own effect on smUtil from the turn-taking's)")
    ap.add_argument("--dump", type=Path, default=None,
                    help="write every raw read (its wall time, the records and the device's utilization samples), "
                         "each burst's wall start/end and event time, and the agent's rows to this JSON file")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = ap.parse_args(argv)
    if args.reward_side is not None:
        side, *rest = LOOPS["reward"]
        LOOPS["reward"] = (args.reward_side, *rest)
    try:
        import torch
    except ImportError:
        return fail("needs torch with CUDA (not installed here); run it on a GPU machine")
    if not torch.cuda.is_available():
        return fail("needs a CUDA GPU (torch sees none here); run it on a GPU machine")
    _src_on_path()
    from trimtab.agent.nvml import NvmlSource
    from trimtab.agent.nvml.activity_reader import ACTIVITY_EVERY_S
    from trimtab.agent.source import SourceUnavailable

    if args.activity_every is None:
        args.activity_every = ACTIVITY_EVERY_S
    try:
        source = NvmlSource(indices=[args.gpu], slow_refresh_s=None, activity_every_s=args.activity_every)
    except SourceUnavailable as exc:
        return fail(f"NVML unavailable: {exc}")
    try:
        return run(args, source)
    finally:
        source.close()


def run(args, source) -> int:
    import pynvml as nv

    handle = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    gpu = source.tick_calls()[0][0]
    ctx = mp.get_context("spawn")
    lock, go, results = ctx.Lock(), ctx.Event(), ctx.Queue()
    readies = {kind: ctx.Event() for kind in LOOPS}
    children = [ctx.Process(target=loop, args=(kind, args.gpu, args.seconds, args.idle_s, lock, readies[kind], go,
                                               results, args.burst_scale, LOOPS[kind])) for kind in LOOPS]
    for child in children:
        child.start()
    progress(f"two loops starting on GPU {args.gpu} (spawned: torch's import and a calibration each)")
    try:
        for kind, ready in readies.items():
            if not ready.wait(60):
                return fail(f"the {kind} loop did not start within 60 s")
        rows, raw, calls, ticks, last_seen, own, dumped = [], [], [], [], 0, {}, []
        util_seen = 0
        go.set()
        next_tick = go_at = time.time()
        next_note = go_at + 5
        progress(f"loops ready; {args.seconds:g} s of turns ({args.idle_s:g} s of it idle), the agent ticking every "
                 f"{args.interval:g} s and reading per-process utilization every {args.activity_every:g} s")
        while len(own) < len(children):
            ts_ms = int(time.time() * 1000)
            rows.extend(source.sample(ts_ms).processes)
            got = []
            try:  # the raw records, apart from the agent: NVML filters by time, so two readers do not interfere
                got = [(s.pid, s.timeStamp, s.smUtil, s.memUtil) for s in
                       nv.nvmlDeviceGetProcessUtilization(handle, last_seen)]
                calls.append(len(got))
                last_seen = max([last_seen, *(g[1] for g in got)])
            except nv.NVMLError as exc:
                calls.append(0 if exc.value == nv.NVML_ERROR_NOT_FOUND else -exc.value)
            raw.extend(got)
            util_now, util_seen, util_mean, util_raw = device_util(nv, handle, util_seen)
            ticks.append((time.time(), util_now, util_mean, got))
            dumped.append({"t_s": time.time(), "records": got, "util_now": util_now, "util_samples": util_raw})
            while not results.empty():  # a loop's bursts, sent as it ends
                kind, pid, bursts = results.get()
                own[kind] = (pid, bursts)
            if time.time() > go_at + args.seconds + args.idle_s + 60:
                return fail("the loops did not report within 60 s of their end")
            if time.time() >= next_note:
                next_note += 5
                progress(f"t={time.time() - go_at:.0f} s: {len(rows)} agent rows, {len(raw)} raw records, device "
                         f"util now {util_now}")
            next_tick += args.interval
            time.sleep(max(0.0, next_tick - time.time()))
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.terminate()
    if gpu.activity is None or not gpu.activity.supported:
        return fail("per-process utilization is unsupported on this GPU/driver (NVML NOT_SUPPORTED)")
    progress("loops done; adding up")
    if args.dump:
        args.dump.write_text(json.dumps({
            "reads": dumped, "loops": {k: list(v) for k, v in LOOPS.items()},
            "bursts": {kind: {"pid": pid, "bursts": bursts} for kind, (pid, bursts) in own.items()},
            "agent_rows": [[r.pid, r.sm_util_pct, r.util_from_ms, r.util_to_ms, r.util_samples] for r in rows]}))
        progress(f"raw reads, bursts and rows written to {args.dump}")
    return report(args, own, rows, raw, calls, ticks, source, dumped)


def device_util(nv, handle, since_us: int) -> tuple:
    """(nvmlDeviceGetUtilizationRates.gpu now, the newest utilization sample's time, the mean of the device's
    utilization samples since ``since_us`` — None where a call fails —, and those samples as (µs, %))."""
    try:
        now = nv.nvmlDeviceGetUtilizationRates(handle).gpu
    except nv.NVMLError:
        now = None
    try:
        _, samples = nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, since_us)
        values = [(x.timeStamp, x.sampleValue.uiVal) for x in samples if x.timeStamp > since_us]
    except nv.NVMLError:
        values = []
    if not values:
        return now, since_us, None, []
    return now, max(t for t, _ in values), statistics.fmean(v for _, v in values), values


def agent_attribution(rows: list) -> dict[int, dict]:
    """Estimator (a) through the agent's and the ledger's own code: per pid, its rows' (busy s, covered s) summed as
    the store sums them (``trimtab.store.ledger.utilization_and_activity``), its busy % from the ledger's
    estimator (``busy_pct_by_process``), and the intervals (ms) its rows cover."""
    _src_on_path()
    from trimtab.grading.ledger.shares import busy_pct_by_process

    sums: dict[int, list] = {}
    for r in rows:
        if r.sm_util_pct is None or r.util_from_ms is None or r.util_to_ms is None:
            continue  # unknown (the baseline, an unanswered interval): left out, as the store leaves it out
        covered_ms = r.util_to_ms - r.util_from_ms
        acc = sums.setdefault(r.pid, [0.0, 0.0, 0, []])
        acc[0] += r.sm_util_pct * covered_ms / 100_000
        acc[1] += covered_ms / 1000
        acc[2] += r.util_samples or 0
        acc[3].append((r.util_from_ms, r.util_to_ms))
    pct = busy_pct_by_process({("node", 0): {pid: (a[0], a[1]) for pid, a in sums.items()}})
    return {pid: {"busy_s": pct[("node", 0, pid)] / 100 * a[1] if ("node", 0, pid) in pct else None,
                  "covered_s": a[1], "records": a[2], "intervals_ms": a[3]} for pid, a in sums.items()}


def report(args, own: dict, rows: list, raw: list, calls: list, ticks: list, source, reads: list = ()) -> int:
    agent = agent_attribution(rows)
    if not agent:
        return fail("the agent's process rows carried no activity (run longer than 5 s?)")
    spans = [span for a in agent.values() for span in a["intervals_ms"]]
    from_ms, to_ms = min(f for f, _ in spans), max(t for _, t in spans)
    by_pid: dict[int, list] = {}
    for r in raw:
        by_pid.setdefault(r[0], []).append(r)
    # The driver samples on a fixed grid: the gaps between distinct record times are multiples of its period (idle
    # stretches leave larger ones), so a low percentile of them is the period.
    stamps = sorted({r[1] for r in raw})
    gaps = sorted((b - a) / 1e6 for a, b in zip(stamps, stamps[1:]) if b > a)
    period_s = gaps[len(gaps) // 10] if gaps else None
    # pids: the children's own, or (PID namespaces) the two NVML pids holding the most memory, generation the larger
    seen = {r.pid for r in rows}
    mapping, how = {kind: pid for kind, (pid, _) in own.items()}, "own PIDs"
    if not set(mapping.values()) <= seen:
        memory = {}
        for r in rows:
            if r.used_memory_bytes:
                memory[r.pid] = max(memory.get(r.pid, 0), r.used_memory_bytes)
        ranked = sorted(memory, key=memory.get, reverse=True)[:2]
        if len(ranked) < 2:
            return fail(f"cannot find the two processes among NVML's PIDs {sorted(seen)}")
        mapping, how = dict(zip(("generation", "reward"), ranked)), "memory held (PID namespace: own PIDs not seen)"
    gpu_activity = source.tick_calls()[0][0].activity
    out = {"gpu": args.gpu, "interval_ms": [from_ms, to_ms], "sampling_period_s": period_s, "pid_mapping": how,
           "activity_every_s": getattr(args, "activity_every", None), "idle_s": getattr(args, "idle_s", 0.0),
           "records_per_call": {"median": statistics.median(calls) if calls else None, "max": max(calls, default=None)},
           "activity_function": gpu_activity.function_name,
           "pick_costs_ms": {k: v * 1000 for k, v in (getattr(gpu_activity, "pick_costs_s", None) or {}).items()},
           "failed_calls": source.activity_failed_calls(), "processes": {}}
    utils = [t[1] for t in ticks if t[1] is not None]
    out["device_util"] = {"ticks": len(ticks), "mean_pct_of_readings": statistics.fmean(utils) if utils else None,
                          "mean_pct_of_samples": _mean([t[2] for t in ticks])}
    estimators = {"b_share_x_util": share_times_util(ticks, False),
                  "b2_share_x_util_samples": share_times_util(ticks, True),
                  "c_sm_x_dt_gpu": sm_times_dt(raw, False), "c2_sm_x_dt_process": sm_times_dt(raw, True),
                  "d_driver_rule": driver_rule(reads, {pid: bursts for pid, bursts in own.values()})}
    within = True
    for kind, pid in mapping.items():
        mine = agent.get(pid, {"busy_s": None, "covered_s": 0.0, "records": 0, "intervals_ms": []})
        bursts = own[kind][1]
        # the truth over exactly the intervals the process's rows cover
        own_s = sum(own_busy_s(bursts, f / 1000, t / 1000) for f, t in mine["intervals_ms"])
        agent_s = mine["busy_s"]
        ratio = agent_s / own_s if agent_s is not None and own_s else None
        within = within and ratio is not None and abs(ratio - 1) <= GOAL
        out["processes"][kind] = {"pid": pid, "own_busy_s": own_s, "agent_busy_s": agent_s,
                                  "agent_over_own": ratio, "covered_s": mine["covered_s"],
                                  "rows": len(mine["intervals_ms"]), "records": mine["records"],
                                  "own_busy_s_all": sum(b for _, _, b in bursts),
                                  "zero_sm_records": sum(1 for s in by_pid.get(pid, ()) if s[2] == 0),
                                  "estimators": {}}
        for name, (busy, span) in estimators.items():
            own_span = own_busy_s(bursts, *span) if span else None
            got = busy.get(pid) if span else None
            out["processes"][kind]["estimators"][name] = {
                "busy_s": got, "own_busy_s": own_span, "span_s": span[1] - span[0] if span else None,
                "over_own": got / own_span if got is not None and own_span else None}
    for p in out["processes"].values():  # what the agent loses beyond the driver's own rule
        d = p["estimators"]["d_driver_rule"]["over_own"]
        p["agent_over_driver_rule"] = p["agent_over_own"] / d if p["agent_over_own"] is not None and d else None
    out["within_goal"] = within
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print_report(out)
    return 0 if within else 1


def print_report(out: dict) -> None:
    f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    span = (out["interval_ms"][1] - out["interval_ms"][0]) / 1000
    costs = ", ".join(f"{name} {ms:.3f} ms" for name, ms in out["pick_costs_ms"].items()) or "—"
    print(f"GPU {out['gpu']}: the agent reads per-process utilization with {out['activity_function']} every "
          f"{out['activity_every_s']} s, off the tick (each way's cost at its pick: {costs}); its rows cover "
          f"{span:.1f} s; NVML sampling period {f(out['sampling_period_s'])} s (from the raw records' times); raw "
          f"records per call median {out['records_per_call']['median']}, max {out['records_per_call']['max']}; "
          f"idle mid-run {out['idle_s']:g} s; PIDs by {out['pid_mapping']}; failed calls {out['failed_calls']}")
    print(f"  {'process':12}{'pid':>9}{'own busy s':>12}{'agent s':>10}{'agent/own':>11}{'covered s':>11}"
          f"{'rows':>6}{'records':>9}{'sm=0':>6}")
    for kind, p in out["processes"].items():
        print(f"  {kind:12}{p['pid']:>9}{f(p['own_busy_s']):>12}{f(p['agent_busy_s']):>10}{f(p['agent_over_own']):>11}"
              f"{f(p['covered_s'], 1):>11}{p['rows']:>6}{p['records']:>9}{p['zero_sm_records']:>6}")
    u = out["device_util"]
    print(f"device utilization over {u['ticks']} ticks: mean of nvmlDeviceGetUtilizationRates readings "
          f"{f(u['mean_pct_of_readings'], 1)} %, of nvmlDeviceGetSamples means {f(u['mean_pct_of_samples'], 1)} %")
    names = list(next(iter(out["processes"].values()))["estimators"])
    print(f"  estimators / own total: {'process':12}{'(a) agent':>11}" + "".join(f"{n:>26}" for n in names))
    for kind, p in out["processes"].items():
        cells = "".join(f"{f(e['over_own'])} ({f(e['busy_s'], 2)}/{f(e['own_busy_s'], 2)} s)".rjust(26)
                        for e in p["estimators"].values())
        print(f"  {'':24}{kind:12}{f(p['agent_over_own']):>11}{cells}")
    print("the agent against the driver's own rule (d), the best a reader of NVML can do: " + ", ".join(
        f"{kind} {f(p['agent_over_driver_rule'])}" for kind, p in out["processes"].items()))
    print(f"attribution {'within' if out['within_goal'] else 'NOT within'} {GOAL:.0%} of each process's own CUDA-event "
          f"total (the agent's, (a)); other estimators within it: " + (", ".join(
              n for n in names if all(p["estimators"][n]["over_own"] is not None
                                      and abs(p["estimators"][n]["over_own"] - 1) <= GOAL
                                      for p in out["processes"].values())) or "none"))


if __name__ == "__main__":
    sys.exit(main())
