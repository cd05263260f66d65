"""Issue 7, items 2–4: the data-parallel reference pipeline on the reference device map (actor and reference model
together, critic and reward model on GPUs of their own) under the rebalancer in ``auto``, from the bad defaults;
per-rank acknowledgements of every change; throughput against a small static grid measured in the same run; the NCCL
latency probe per step and its baseline; the placement advice and, with ``--run-placement``, the measured effect of
running it.

One `trimtab up` (NVML agent at 1 s, SQLite, rebalancer) on loopback; the ranks are WORLD_SIZE processes
(``torch.multiprocessing.spawn``; NCCL with NVLink multicast off on CUDA, gloo on CPU), each a
``DataParallelPipeline`` (``trimtab.workload.ddp``) on its own device map, all built once. In that one
spawn, every rank: (1) measures each static setting of ``--grid`` (no hook; ``--warmup`` + ``--grid-steps``
steps); (2) attaches the hook (mode ``auto``, knobs at the defaults (1, 0, 1), ``--probe-every`` steps between NCCL
latency probes) and runs until rank 0 sees the rebalancer settled for ``--tail`` steps, or ``--max-steps`` /
``--budget-s`` (rank 0 decides, a gloo all-reduce tells the others, so every rank stops at the same step); (3)
measures the grid's best setting again (best = mean of before and after, as ``bench/rebalance.py``) and the auto
run's final knobs (``--after-steps``). Job throughput per step = the ranks' samples summed / the slowest rank's
step time. With ``--run-placement`` and a decision whose evidence holds a ``placement`` proposal, the ranks are
spawned again on the proposed map (split per rank as ``ddp.split_job_map`` does) and measure the final knobs; the
agent's busy % per GPU over both windows shows the spread the advice predicted.

The device map: ``--device-map`` is the *job* map (``actor`` = one device per rank), default
``actor=0,1;ref=0,1;critic=2;reward=3`` (2 ranks on 4 GPUs; both ranks' critics share GPU 2, both reward models
GPU 3). On 2 GPUs: ``--device-map 'actor=0,1;ref=0,1;critic=1;reward=0'`` (scaled down). ``--rank-maps`` takes
explicit per-rank maps (JSON list). On CPU: ``--device-map cpu --world 2`` (gloo; the daemon runs a simulated node,
so agent figures are synthetic; ``--declare-map`` declares a GPU map to trimtab so that the placement path runs
against the simulated node, see the CPU command below).

On the 4-GPU machine (H100 or H200, one call, ≈ 7–8 min; the lead installs the wheels first):

    python3 bench/multigpu_pipeline.py --config h200 --device-map 'actor=0,1;ref=0,1;critic=2;reward=3' \\
        --grid '64,2,4;16,2,1' --grid-steps 6 --max-steps 70 --budget-s 240 --tail 10 --after-steps 6 \\
        --run-placement --placement-steps 8 --json $OUT/multigpu_pipeline.json

Combined with items 1 and 3 in one ``nvidia-h200-x4`` call (JSON and text under $OUT; ≈ 9 min, inside
the 10-minute limit only if the install is quick — else give each its own call):

    nvidia-smi topo -m; python3 bench/nvml_tick.py --ticks 150 --naive-ticks 5 2>&1 | tee $OUT/nvml_tick.txt; \\
      python3 bench/multigpu_nvlink.py --phase-s 10 --json $OUT/multigpu_nvlink.json \\
      2>&1 | tee $OUT/multigpu_nvlink.txt; timeout 450 python3 bench/multigpu_pipeline.py --config h200 \\
      --device-map 'actor=0,1;ref=0,1;critic=2;reward=3' --grid '64,2,4;16,2,1' --grid-steps 6 --max-steps 70 \\
      --budget-s 200 --tail 8 --after-steps 6 --run-placement --placement-steps 8 \\
      --json $OUT/multigpu_pipeline.json 2>&1 | tee $OUT/multigpu_pipeline.txt

Here (CPU, 2 gloo ranks, simulated node; ≈ 45 s):

    python3 bench/multigpu_pipeline.py --config cpu --device-map cpu --world 2 --grid '64,2,1' \\
        --grid-steps 3 --max-steps 80 --budget-s 90 --tail 25 --after-steps 3 \\
        --declare-map 'actor=0,1;ref=0,1;critic=2;reward=3' \\
        --daemon-args "--interval 1 --scenario actor-hot --hostname $(hostname)" --run-placement --placement-steps 3

(``--hostname``: the simulated node must carry the job's hostname, or the rebalancer finds no GPU samples for it.)

``--dry-run`` prints the plan (rank maps, declared map, phases) and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.pipeline_report import DEFAULTS, knobs_dict, parse_grid, phase_steps, summarize  # noqa: E402

START_S = time.perf_counter()
SEED_MAP = "actor=0,1;ref=0,1;critic=2;reward=3"


# -- the ranks ------------------------------------------------------------------------------------------------------

def rank_main(rank: int, world: int, port: int, plan_path: str) -> None:
    """One rank (``torch.multiprocessing.spawn`` target): see the module docstring for the phases."""
    import logging
    import types

    from trimtab.workload.ddp import apply_safe_env

    apply_safe_env()
    import torch
    import torch.distributed as dist

    from trimtab.trainer import attach
    from trimtab.workload import story
    from trimtab.workload.config import preset
    from trimtab.workload.ddp import (DataParallelPipeline, init_distributed, params_digest,
                                              rank_device_map)
    from trimtab.workload.loop import set_cpu_threads

    plan = json.loads(Path(plan_path).read_text())
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(relativeCreated)8.0f ms rank {rank}: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one line per report otherwise
    devices = rank_device_map(plan["rank_maps"][rank])
    init_distributed(devices, f"tcp://127.0.0.1:{port}", rank, world)
    ctl = dist.new_group(backend="gloo")   # stop decisions and choices: rank 0 decides, everyone follows
    set_cpu_threads(devices, plan.get("cpu_threads"))
    config = preset(plan["config"], **plan.get("overrides", {}))
    t0 = plan["t0"]

    def say(line: str) -> None:
        if rank == 0:
            print(f"[{time.time() - t0:6.1f} s] {line}", flush=True)

    def agreed(value: float, op=dist.ReduceOp.MAX) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=op, group=ctl)
        return t.item()

    out: dict[str, Any] = {"rank": rank, "device_map": str(devices), "phases": []}

    def measure(name: str, knobs: Sequence[int], warmup: int, steps: int) -> float:
        start = time.time()
        tp, records = story.measure_static(pipe, knobs_dict(knobs), warmup=warmup, steps=steps)
        out["phases"].append({"name": name, "knobs": list(knobs), "start": start, "end": time.time(),
                              "records": [r.as_dict() for r in records]})
        say(f"{name} {knobs[0]},{knobs[1]},{knobs[2]}: {tp:.2f} samples/s on rank 0 over {steps} steps")
        return tp

    say(f"rank 0 of {world}: {devices}; building models")
    with DataParallelPipeline(config, devices, knobs=knobs_dict(plan["grid"][0] if plan["grid"] else DEFAULTS),
                              log=say, bucket_mb=plan.get("bucket_mb", 256)) as pipe:
        say("models built")
        grid_tp = [measure("static", k, plan["warmup"], plan["grid_steps"]) for k in plan["grid"]]
        final = None
        auto = plan.get("auto")
        if auto:
            hook = attach(job=plan["job"], server=plan["server"], token=plan["token"], device_map=plan["hook_map"],
                          knobs=story.declaration(knobs_dict(DEFAULTS), config), mode="auto",
                          probe_every=auto["probe_every"], backoff_max_s=1.0)
            settled = story.rebalancer_idle(types.SimpleNamespace(url=plan["server"], token=plan["token"]), plan["job"])
            pipe.hook, pipe.knobs = hook, hook.knobs
            pipe.restart_workers()
            records, quiet, started, why = [], 0, time.monotonic(), f"{auto['max_steps']} steps"
            pipe._boundary_s = None
            while len(records) < auto["max_steps"]:
                record = pipe.step()
                records.append(record)
                say(f"auto {record.line()}")
                stop = 0.0
                if rank == 0:
                    quiet = quiet + 1 if settled() else 0
                    if quiet >= auto["tail"]:
                        stop = 1.0
                    elif time.monotonic() - started > auto["budget_s"]:
                        stop = 2.0
                stop = agreed(stop)
                if stop:
                    why = (f"settled: {auto['tail']} steps in a row with nothing to change" if stop == 1.0
                           else f"time budget {auto['budget_s']:.0f} s")
                    break
            hook.close()
            final = [int(hook.knobs[k]) for k in ("batch_size", "prefetch", "sync_every")]
            out["auto"] = {"records": [r.as_dict() for r in records], "stopped_because": why,
                           "hook_stats": hook.stats, "final_knobs": final}
            pipe.hook = None
            say(f"auto run: {len(records)} steps, {why}; final knobs {final}")
        if plan["after_steps"]:
            if grid_tp:
                best = int(agreed(max(range(len(grid_tp)), key=grid_tp.__getitem__) if rank == 0 else -1))
                measure("best again", plan["grid"][best], plan["warmup"], plan["after_steps"])
                out["best_index"] = best
            if final is not None:
                measure("final knobs", final, plan["warmup"], plan["after_steps"])
        out["grads"] = pipe.grads.stats
        out["actor_digest"] = params_digest(pipe.actor)
    Path(plan["out_dir"], f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def spawn_ranks(plan: dict, world: int, work: Path, tag: str) -> list[dict]:
    import socket

    import torch.multiprocessing as mp

    out_dir = work / tag
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = {**plan, "out_dir": str(out_dir)}
    plan_path = out_dir / "plan.json"
    plan_path.write_text(json.dumps(plan))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, port, str(plan_path)), nprocs=world, join=True)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


# -- the parent -----------------------------------------------------------------------------------------------------

def gpu_busy(daemon, start_s: float, end_s: float) -> dict[int, Optional[float]]:
    """Mean busy % per GPU (SM activity where GPM has it, else NVML util) from the agent's samples in a window."""
    from trimtab.store.engine import open_engine
    from trimtab.store.queries import gpu_aggregates

    engine = open_engine(f"sqlite:///{daemon.state_dir / 'trimtab.db'}")
    try:
        # A sample's rates cover the tick before it: skip the first second of a long window, widen a short one.
        lo, hi = (start_s + 1.0, end_s) if end_s - start_s > 3.0 else (start_s, end_s + 1.0)
        rows = gpu_aggregates(engine, int(lo * 1000), int(hi * 1000))
    finally:
        engine.dispose()
    out = {}
    for g in rows:
        busy = g.mean.get("sm_active_pct")
        out[g.gpu_index] = busy if busy is not None else g.mean.get("util_pct")
    return out


def fetch_all(daemon, path: str, key: str) -> list[dict]:
    from trimtab.workload import story

    rows, offset = [], 0
    while offset is not None:
        sep = "&" if "?" in path else "?"
        page = story.api_get(daemon, f"{path}{sep}limit=1000&offset={offset}")
        rows += page[key]
        offset = page.get("next_offset")
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h200")
    ap.add_argument("--samples-per-step", type=int, default=None)
    ap.add_argument("--device-map", default=None, help=f"job map (default {SEED_MAP!r} on ≥ 4 GPUs, else cpu)")
    ap.add_argument("--rank-maps", default=None, help="JSON list of per-rank maps (instead of --device-map)")
    ap.add_argument("--world", type=int, default=None, help="ranks, for --device-map cpu|cuda (default 2)")
    ap.add_argument("--declare-map", default=None, help="job map declared to trimtab (default: the real one)")
    ap.add_argument("--grid", default="64,2,4;16,2,1", help="static settings b,p,s;… measured before the auto run")
    ap.add_argument("--grid-steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=70)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--tail", type=int, default=10)
    ap.add_argument("--probe-every", type=int, default=1, help="steps between NCCL latency probes")
    ap.add_argument("--after-steps", type=int, default=6, help="steps of the best setting and final knobs after")
    ap.add_argument("--run-placement", action="store_true")
    ap.add_argument("--placement-steps", type=int, default=8)
    ap.add_argument("--bucket-mb", type=float, default=256)
    ap.add_argument("--cpu-threads", type=int, default=None)
    ap.add_argument("--daemon-args", default="--interval 1")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)

    from trimtab.workload.ddp import apply_safe_env, hook_map, parse_job_map, split_job_map

    apply_safe_env()
    if args.rank_maps:
        rank_maps = json.loads(args.rank_maps)
        world = len(rank_maps)
    else:
        text = args.device_map
        if text is None:
            import torch

            text = SEED_MAP if torch.cuda.device_count() >= 4 else "cpu"
        world = args.world if text in ("cpu", "cuda") else None
        job_map = parse_job_map(text, world or 2)
        rank_maps = split_job_map(job_map)
        world = len(rank_maps)
    declared = (hook_map(split_job_map(parse_job_map(args.declare_map), world)) if args.declare_map
                else hook_map(rank_maps))
    grid = parse_grid(args.grid)
    overrides = {"samples_per_step": args.samples_per_step} if args.samples_per_step else {}
    plan = {"config": args.config, "overrides": overrides, "rank_maps": rank_maps, "hook_map": declared,
            "grid": [list(g) for g in grid], "warmup": args.warmup, "grid_steps": args.grid_steps,
            "after_steps": args.after_steps, "bucket_mb": args.bucket_mb, "cpu_threads": args.cpu_threads,
            "auto": {"max_steps": args.max_steps, "budget_s": args.budget_s, "tail": args.tail,
                     "probe_every": args.probe_every}}
    print(f"plan: {world} ranks; per-rank maps {json.dumps(rank_maps)}; declared to trimtab {declared}; "
          f"grid {grid}; auto from {DEFAULTS} (≤ {args.max_steps} steps, ≤ {args.budget_s:.0f} s, settled after "
          f"{args.tail}); probe every {args.probe_every} step(s); after: best + final knobs × {args.after_steps}"
          f"{'; then the placement proposal × ' + str(args.placement_steps) if args.run_placement else ''}; "
          f"env {' '.join(f'{k}={os.environ[k]}' for k in ('NCCL_NVLS_ENABLE', 'TORCH_SYMM_MEM_DISABLE_MULTICAST', 'NVSHMEM_DISABLE_NVLS'))}",
          flush=True)
    if args.dry_run:
        return 0

    from trimtab.workload import story

    work = Path(tempfile.mkdtemp(prefix="trimtab-ddp-"))
    daemon = story.start_daemon(work / "daemon", args=args.daemon_args.split())
    print(f"trimtab up at {daemon.url} (state {daemon.state_dir})", flush=True)
    job = f"ddp-{args.config}-{int(time.time())}"
    plan.update(job=job, server=daemon.url, token=daemon.token, t0=time.time())
    placement_ranks = None
    try:
        ranks = spawn_ranks(plan, world, work, "main")
        time.sleep(2.0)   # the last reports and the agent's last samples land
        changes = fetch_all(daemon, f"/v1/jobs/{job}/changes", "changes")
        reports = fetch_all(daemon, f"/v1/jobs/{job}/reports", "reports")
        decisions = fetch_all(daemon, f"/v1/decisions?job={job}", "decisions")
        health = story.api_get(daemon, "/healthz")
        simulated = bool(health.get("components", {}).get("agent", {}).get("simulated"))
        proposal = next((d["evidence"]["placement"] for d in decisions if (d.get("evidence") or {}).get("placement")),
                        None)
        final = ranks[0].get("auto", {}).get("final_knobs")
        busy_final = busy_placed = None
        if final is not None and args.after_steps:
            _, s0, s1 = phase_steps(ranks, "final knobs")
            busy_final = gpu_busy(daemon, s0, s1)
        if args.run_placement and proposal is not None and final is not None:
            on_cpu = all(v == ["cpu"] for m in rank_maps for v in m.values())
            new_maps = rank_maps if on_cpu else split_job_map(proposal["device_map"], world)
            print(f"\nrunning the placement proposal {proposal['device_map']} → per-rank {json.dumps(new_maps)}"
                  f"{' (CPU run: the proposal names GPUs; the same CPU maps run again, path exercised only)' if on_cpu else ''}",
                  flush=True)
            placed_plan = {**plan, "rank_maps": new_maps, "grid": [final], "grid_steps": args.placement_steps,
                           "auto": None, "after_steps": 0, "t0": time.time()}
            placement_ranks = spawn_ranks(placed_plan, world, work, "placement")
            time.sleep(2.0)
            _, s0, s1 = phase_steps(placement_ranks, "static")
            busy_placed = gpu_busy(daemon, s0, s1)
    finally:
        daemon.stop()

    report = summarize(args, ranks, world, grid, changes, reports, decisions, proposal, placement_ranks,
                       busy_final, busy_placed, declared, simulated, time.perf_counter() - START_S)
    if args.json:
        args.json.write_text(json.dumps({**report, "ranks": ranks, "placement_ranks": placement_ranks,
                                         "changes": changes, "decisions": decisions, "reports": reports},
                                        indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)  # the daemon's store and log, the ranks' result files
    return 0

if __name__ == "__main__":
    sys.exit(main())
