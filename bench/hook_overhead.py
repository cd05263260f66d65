"""What does the trainer hook cost a training step? The same pipeline steps with and without it, in one run.

Builds two identical reference pipelines (same config, seed and fixed knobs): one driven by a plain knob mapping
(no hook), one through `trimtab.trainer.attach(...)` — reporting to a live server with ``--server`` (e.g. a
`trimtab up` on the same machine), standalone otherwise. Runs them in alternating blocks of ``--block`` steps so
drift (clocks, thermals, allocator growth) hits both alike, and reports the median step time of each and the
overhead ratio (goal ≤ 1 %). Because step-to-step spread can exceed 1 %, it also measures the hook's own cost
directly: wall time inside ``step_end`` on the training thread, and the CPU time of the reporter thread (which
competes for the GIL), each per step and as a share of the median step.

    python bench/hook_overhead.py --config h200 --rounds 4 --block 5 --server http://127.0.0.1:9460 --token …
    python3 bench/hook_overhead.py --config smoke --device-map cpu --rounds 3 --block 20 --daemon \
        --report-batch-max 1   # one POST per report; against the default 64, which batches only reports that queued
                               # (steps shorter than a POST): the reporter thread's CPU per step of each
    python3 bench/hook_overhead.py --config h200 --device-map cuda:0 --batch-size 64 --prefetch 2 --sync-every 4 \
        --rounds 8 --block 12 --daemon     # the best static's knobs, its own `trimtab up` (next H200 session)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def thread_cpu_s(name_prefix: str):
    """CPU seconds (user + system) used so far by the live thread whose name starts with ``name_prefix``."""
    import threading

    import psutil

    ids = {t.native_id for t in threading.enumerate() if t.name.startswith(name_prefix)}
    if not ids:
        return None
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--device-map", default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--sync-every", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--server", default=None)
    ap.add_argument("--token", default=None)
    ap.add_argument("--daemon", action="store_true",
                    help="start a `trimtab up` on a loopback port for the run and report to it (instead of --server)")
    ap.add_argument("--no-cuda-events", action="store_true",
                    help="attach with cuda_events=False (wall clock only): tells the event records' cost apart")
    ap.add_argument("--report-batch-max", type=int, default=64,
                    help="attach(..., report_batch_max=N): most queued reports in one POST (1: one POST per report)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    daemon = None
    if args.daemon:
        from trimtab.workload import story
        daemon = story.start_daemon(args=["--interval", "1"])
        args.server, args.token = daemon.url, daemon.token
    try:
        return _run(args)
    finally:
        if daemon is not None:
            daemon.close(False)


def _run(args) -> int:

    from trimtab.trainer import attach
    from trimtab.workload.cli import knob_declaration
    from trimtab.workload.config import Knobs, parse_device_map, preset
    from trimtab.workload.loop import Pipeline

    config = preset(args.config)
    devices = parse_device_map(args.device_map)
    knobs = {"batch_size": args.batch_size, "prefetch": args.prefetch, "sync_every": args.sync_every}
    hook = attach(job="hook-overhead", server=args.server, token=args.token, device_map=devices.as_hook_map(),
                  knobs=knob_declaration(Knobs.read(knobs), config.samples_per_step),
                  cuda_events=not args.no_cuda_events, report_batch_max=args.report_batch_max)
    times: dict[str, list[float]] = {"without": [], "with": []}
    in_step_end: list[float] = []
    step_end = hook.step_end

    def timed_step_end(*a, **kw):
        t0 = time.perf_counter()
        try:
            return step_end(*a, **kw)
        finally:
            in_step_end.append(time.perf_counter() - t0)

    hook.step_end = timed_step_end
    with Pipeline(config, devices, knobs=dict(knobs)) as plain, Pipeline(config, devices, hook=hook) as hooked:
        plain.run(args.warmup, None)
        hooked.run(args.warmup, None)
        for _ in range(args.rounds):
            for name, pipe in (("without", plain), ("with", hooked)):
                times[name] += [r.step_s for r in pipe.run(args.block, None)]
    time.sleep(1.0)  # let the reporter post the last reports before closing
    reporter_cpu_s = thread_cpu_s("trimtab-reporter")
    hook.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = med["with"] / med["without"] - 1
    # every step carries the same samples: throughput is steps over their summed time — the mean, which the
    # median misses where one step in sync_every carries the weight sync
    mean_overhead = statistics.fmean(times["with"]) / statistics.fmean(times["without"]) - 1
    hooked_steps = args.warmup + args.rounds * args.block
    per_step = {"step_end_s": sum(in_step_end) / max(1, len(in_step_end)),
                "reporter_cpu_s": reporter_cpu_s / hooked_steps if reporter_cpu_s is not None else None}
    print(f"config {config.name}, knobs {knobs}, {args.rounds} rounds × {args.block} steps each, server {args.server}, "
          f"cuda events {'off' if args.no_cuda_events else 'on'}, report batch max {args.report_batch_max}")
    print(f"median step without hook: {med['without'] * 1e3:.2f} ms   with hook: {med['with'] * 1e3:.2f} ms   "
          f"overhead {overhead * 100:+.2f} %   (goal ≤ 1 %); mean step (throughput) {mean_overhead * 100:+.2f} %")
    share = {k: (v / med["without"] if v is not None else None) for k, v in per_step.items()}
    print(f"hook cost per step: step_end {per_step['step_end_s'] * 1e3:.3f} ms ({share['step_end_s'] * 100:.3f} % of a step), "
          + (f"reporter thread CPU {per_step['reporter_cpu_s'] * 1e3:.3f} ms ({share['reporter_cpu_s'] * 100:.3f} %)"
             if per_step["reporter_cpu_s"] is not None else "reporter thread CPU: not measurable here"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"median_s": med, "overhead": overhead, "mean_overhead": mean_overhead, "times_s": times,
                       "knobs": knobs, "report_batch_max": args.report_batch_max,
                       "hook_cost_per_step_s": per_step, "hook_cost_share_of_step": share}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
