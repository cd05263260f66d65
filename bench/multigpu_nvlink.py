"""Issue 7, item 1: do the agent's NVLink TX/RX per GPU agree with the bytes a known load moved over NVLink (goal:
within 5 %), is PCIe still right, and what does a tick cost per GPU with all GPUs sampled?

Starts `trimtab up` (real NVML agent, 1 s ticks, SQLite, on loopback) and drives phases of ``--phase-s`` seconds on
N GPUs (default all visible), with NVLink multicast off (NCCL_NVLS_ENABLE=0 and the other two, set before any NCCL
or CUDA start):

  peer       GPU i → GPU (i+1) % N copies of ``--peer-mib`` MiB, one thread and a private stream pair per GPU
             pair, all pairs at once (cudaMemcpyPeerAsync with peer access on). GPU i: TX = its pair's rate,
             RX = the rate of the pair into it.
  allreduce  an NCCL all-reduce loop of ``--ar-mib`` MiB over N processes (torch.multiprocessing.spawn). With
             NCCL_ALGO=Ring and NCCL_PROTO=Simple (``--nccl-algo`` / ``--nccl-proto``; set so the accounting
             holds), each rank sends and receives 2(N−1)/N × size per all-reduce.
  h2d        pinned host → GPU copies of ``--h2d-mib`` MiB on every GPU at once: PCIe RX = the copy rate (NVML
             counts protocol bytes: BENCHMARKS.md measured +8.7–12.5 % over payload on one GPU).
  idle       nothing: NVLink reads ~0 (not NULL where supported).

Each load keeps its own byte marks (time, cumulative bytes after a synchronize). For each phase the agent's samples
of each GPU are read from the store (``store.queries.gpu_aggregates``) over the phase's interior — samples stamped
from ``start + interval + 0.5 s`` to ``end − 0.5 s`` (a sample's rates cover the tick before it) — and the load's
rate over the span those samples cover. The bench also reads NVML's own NVLink data counters
(``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, payload only, cumulative KiB) at each phase's window edges, as a
second reference next to the agent's GPM figure. Tick cost: the daemon's ``/healthz`` (``components.agent.
last_tick_cost_s``) polled every 0.5 s; median per phase, divided by N, against the single-GPU figure in
BENCHMARKS.md (490 µs wall per GPU per tick, `nvml_tick.py`, H200; the daemon's tick also reads the host source).

On the 4-GPU machine (H100 or H200; ≈ 75 s; the lead installs the wheels first):

    nvidia-smi topo -m; python3 bench/multigpu_nvlink.py --phase-s 10 --json $OUT/multigpu_nvlink.json

(2 GPUs: the same command; ``--gpus 0,1`` to pick.) The per-GPU NVML cost without the host source, like for like
with BENCHMARKS.md: ``python3 bench/nvml_tick.py --ticks 150 --naive-ticks 5`` (all GPUs, per GPU per tick). The combined one-call line for ``nvidia-h200-x4`` (items 1–4)
is in ``bench/multigpu_pipeline.py``'s docstring. Here: ``python3 bench/multigpu_nvlink.py --dry-run --gpus
0,1,2,3`` prints the plan; the arithmetic is ``bench/nvlink_accounting.py``'s (tested by
``tests/bench/test_multigpu_nvlink.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.nvlink_accounting import (GOAL_PCT, ROW_HEADER, SAFE_ENV, NvlinkCounters, Stream, costs_in,  # noqa: E402
                                     covered_span, expected_rates, markdown, peer_ring_pairs, phase_rows, plan_text,
                                     ring_allreduce_bytes_per_rank, sample_window, tick_cost_per_gpu_us)

PHASES = ("peer", "allreduce", "h2d", "idle")
SINGLE_GPU_TICK_US = 490.0     # BENCHMARKS.md: NvmlSource.sample() wall, median µs per GPU per tick (H200, run 1)
SINGLE_GPU_TICK_US_RUN2 = 589.2


# -- loads (CUDA) ----------------------------------------------------------------------------------------------------

def _timed_loop(seconds: float, step, nbytes: int, start_barrier: Optional[threading.Barrier] = None) -> list:
    if start_barrier is not None:
        start_barrier.wait()
    t0 = time.time()
    marks, moved = [(t0, 0)], 0
    while time.time() - t0 < seconds:
        step()
        moved += nbytes
        marks.append((time.time(), moved))
    return marks


def drive_peer(gpus: Sequence[int], seconds: float, mib: int, copies_per_sync: int = 4) -> list[Stream]:
    import torch

    pairs = peer_ring_pairs(gpus)
    for s, d in pairs:
        if not torch.cuda.can_device_access_peer(s, d):
            print(f"warning: GPU {s} cannot access GPU {d} as a peer: that copy is staged through the host", flush=True)
    nbytes = mib << 20
    streams = [Stream("nvlink", s, d) for s, d in pairs]
    barrier = threading.Barrier(len(pairs))
    errors: list = []

    def worker(k: int) -> None:
        try:
            s, d = pairs[k]
            src = torch.empty(nbytes, dtype=torch.uint8, device=s)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=d)
            # Current streams are per thread and device: a private pair keeps torch's cross-device barrier
            # (the copy waits on the destination's current stream) from chaining the pairs into one queue.
            ss, ds = torch.cuda.Stream(device=s), torch.cuda.Stream(device=d)
            with torch.cuda.device(s), torch.cuda.stream(ss), torch.cuda.stream(ds):
                dst.copy_(src, non_blocking=True)
                ss.synchronize()
                ds.synchronize()

                def step():
                    for _ in range(copies_per_sync):
                        dst.copy_(src, non_blocking=True)
                    ss.synchronize()

                streams[k].marks = _timed_loop(seconds, step, nbytes * copies_per_sync, barrier)
                ds.synchronize()
        except BaseException as exc:  # surface in the main thread
            errors.append(exc)
            barrier.abort()

    _run_threads(len(pairs), worker, errors)
    return streams


def _run_threads(n: int, worker, errors: list) -> None:
    """Run ``worker(k)`` for k < n in threads (one per stream), re-raise the first error, free the copies' memory."""
    import torch

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    torch.cuda.empty_cache()


def drive_h2d(gpus: Sequence[int], seconds: float, mib: int) -> list[Stream]:
    import torch

    nbytes = mib << 20
    streams = [Stream("pcie", None, g) for g in gpus]
    barrier = threading.Barrier(len(gpus))
    errors: list = []

    def worker(k: int) -> None:
        try:
            g = gpus[k]
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=g)
            st = torch.cuda.Stream(device=g)
            with torch.cuda.device(g), torch.cuda.stream(st):
                def step():
                    dev.copy_(host, non_blocking=True)
                    st.synchronize()
                step()
                streams[k].marks = _timed_loop(seconds, step, nbytes, barrier)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    _run_threads(len(gpus), worker, errors)
    return streams


def _allreduce_rank(rank: int, gpus: list, port: int, seconds: float, mib: int, out_dir: str) -> None:
    os.environ.update(SAFE_ENV)
    import torch
    import torch.distributed as dist

    world = len(gpus)
    torch.cuda.set_device(gpus[rank])
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    numel = (mib << 20) // 4
    buf = torch.zeros(numel, dtype=torch.float32, device=gpus[rank])
    for _ in range(5):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    per_op = (time.perf_counter() - t) / 10
    iters = torch.tensor([max(10, int(seconds / per_op))], dtype=torch.int64, device=gpus[rank])
    dist.all_reduce(iters, op=dist.ReduceOp.MIN)   # every rank runs the same number of all-reduces
    sent = ring_allreduce_bytes_per_rank(numel * 4, world)
    per_sync = 4
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.time()
    marks, moved = [(t0, 0.0)], 0.0
    done = 0
    while done < int(iters.item()):
        k = min(per_sync, int(iters.item()) - done)
        for _ in range(k):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        done += k
        moved += k * sent
        marks.append((time.time(), moved))
    check = torch.ones(8, device=gpus[rank])
    dist.all_reduce(check)
    ok = bool(torch.all(check == world).item())
    Path(out_dir, f"allreduce{rank}.json").write_text(json.dumps({"gpu": gpus[rank], "marks": marks,
                                                                  "per_op_s": per_op, "sum_ok": ok}))
    dist.destroy_process_group()


def drive_allreduce(gpus: Sequence[int], seconds: float, mib: int, work: Path) -> tuple[list[Stream], dict]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_allreduce_rank, args=(list(gpus), port, seconds, mib, str(work)), nprocs=len(gpus), join=True)
    streams, info = [], {}
    for r in range(len(gpus)):
        data = json.loads((work / f"allreduce{r}.json").read_text())
        streams.append(Stream("nvlink", data["gpu"], data["gpu"], [tuple(m) for m in data["marks"]]))
        info[data["gpu"]] = {"per_op_s": data["per_op_s"], "sum_ok": data["sum_ok"]}
    return streams, info


# -- the daemon's tick cost (NVML's payload counters: bench/nvlink_accounting.py) --------------------------------------------------------

class HealthPoller(threading.Thread):
    def __init__(self, daemon, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.d, self.every_s, self.polls, self.stop_event = daemon, every_s, [], threading.Event()

    def run(self) -> None:
        from trimtab.workload import story

        while not self.stop_event.wait(self.every_s):
            try:
                agent = story.api_get(self.d, "/healthz").get("components", {}).get("agent", {})
                self.polls.append((time.time(), agent.get("ticks"), agent.get("last_tick_cost_s")))
            except Exception:
                pass


# -- main ------------------------------------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default=None, help="comma-separated GPU indices (default: all visible)")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--gap-s", type=float, default=1.5, help="pause between phases")
    ap.add_argument("--peer-mib", type=int, default=256)
    ap.add_argument("--ar-mib", type=int, default=256)
    ap.add_argument("--h2d-mib", type=int, default=256)
    ap.add_argument("--nccl-algo", default="Ring", help="NCCL_ALGO for the all-reduce phase ('' = NCCL's choice)")
    ap.add_argument("--nccl-proto", default="Simple", help="NCCL_PROTO ('' = NCCL's choice)")
    ap.add_argument("--daemon-args", default="--interval 1")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    interval = float(args.daemon_args.split("--interval")[1].split()[0]) if "--interval" in args.daemon_args else 1.0
    os.environ.update(SAFE_ENV)
    for key, value in (("NCCL_ALGO", args.nccl_algo), ("NCCL_PROTO", args.nccl_proto)):
        if value:
            os.environ[key] = value
    if args.dry_run:
        print(plan_text(gpus, phases, args.phase_s, args.peer_mib, args.ar_mib, args.h2d_mib, args.nccl_algo,
                        args.nccl_proto, interval))
        return 0

    import torch

    from trimtab.store.engine import open_engine
    from trimtab.store.queries import gpu_aggregates
    from trimtab.workload import story

    if not torch.cuda.is_available():
        print("no CUDA device: this bench needs GPUs (--dry-run prints the plan)", file=sys.stderr)
        return 2
    gpus = gpus or list(range(torch.cuda.device_count()))
    n = len(gpus)
    print(plan_text(gpus, phases, args.phase_s, args.peer_mib, args.ar_mib, args.h2d_mib, args.nccl_algo,
                    args.nccl_proto, interval), flush=True)
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
        print(topo, flush=True)
    except Exception as exc:
        topo = f"nvidia-smi topo -m: {exc}"
    work = Path(tempfile.mkdtemp(prefix="trimtab-nvlink-"))
    daemon = story.start_daemon(work / "daemon", args=args.daemon_args.split())
    print(f"trimtab up at {daemon.url}", flush=True)
    poller = HealthPoller(daemon)
    poller.start()
    counters = NvlinkCounters(gpus)
    results = []
    try:
        time.sleep(3 * interval + 1)   # the first GPM sample pair, and a first tick cost
        for ph in phases:
            extra: dict = {}
            start = time.time()
            before = counters.read()
            if ph == "peer":
                streams = drive_peer(gpus, args.phase_s, args.peer_mib) if n > 1 else []
            elif ph == "allreduce":
                streams, extra = drive_allreduce(gpus, args.phase_s, args.ar_mib, work) if n > 1 else ([], {})
                start = min((s.marks[0][0] for s in streams), default=start)
            elif ph == "h2d":
                streams = drive_h2d(gpus, args.phase_s, args.h2d_mib)
            else:
                time.sleep(args.phase_s)
                streams = []
            end = max((s.marks[-1][0] for s in streams), default=time.time())
            after = counters.read()
            results.append({"phase": ph, "start": start, "end": end, "streams": streams, "extra": extra,
                            "nvml": NvlinkCounters.rates(before, after)})
            print(f"{ph}: {end - start:.1f} s", flush=True)
            time.sleep(args.gap_s)
        time.sleep(2 * interval + 1)   # the last samples reach the store
        engine = open_engine(f"sqlite:///{daemon.state_dir / 'trimtab.db'}")
        health = story.api_get(daemon, "/healthz")
    finally:
        poller.stop_event.set()
        daemon.stop()

    rows, out = [], []
    for r in results:
        window = sample_window(r["start"], r["end"], interval)
        if window is None:
            continue
        span = covered_span(window, interval)
        expected = expected_rates(r["streams"], span)
        agg = {g.gpu_index: {**g.mean, "n": g.n_samples} for g in gpu_aggregates(engine, *window)}
        tick_us = tick_cost_per_gpu_us(costs_in(poller.polls, r["start"], r["end"]), n)
        rows += phase_rows(r["phase"], gpus, agg, expected, r["nvml"], tick_us)
        out.append({"phase": r["phase"], "start": r["start"], "end": r["end"], "window_ms": window,
                    "expected": {f"{k[0]}_{k[1]}_{k[2]}": v for k, v in expected.items()},
                    "agent": {str(g): v for g, v in agg.items()}, "nvml_payload": r["nvml"], "tick_us_per_gpu": tick_us,
                    "extra": r["extra"], "streams": [asdict(s) for s in r["streams"]]})
    engine.dispose()
    print(f"\n{n} GPUs, GB/s = 10⁹ B/s; Δ = agent vs the load's own bytes (goal ±{GOAL_PCT:g} %); NVML data = "
          f"payload counters read by this script at the window edges")
    print(markdown(ROW_HEADER, rows))
    ticks = [o["tick_us_per_gpu"] for o in out if o["tick_us_per_gpu"] is not None]
    agent_h = health.get("components", {}).get("agent", {})
    if ticks:
        worst = max(ticks)
        print(f"\ntick cost per GPU (daemon tick / {n}, host source included): median per phase "
              f"{', '.join('%s %.0f' % (o['phase'], o['tick_us_per_gpu']) for o in out if o['tick_us_per_gpu'])} µs; "
              f"worst {worst:.0f} µs vs {SINGLE_GPU_TICK_US:g} µs single-GPU (BENCHMARKS.md; {SINGLE_GPU_TICK_US_RUN2:g} "
              f"on a second lease): {'within' if worst <= SINGLE_GPU_TICK_US_RUN2 else 'ABOVE'}; ticks "
              f"{agent_h.get('ticks')}, skipped {agent_h.get('ticks_skipped')}")
    sums = {g: v.get("sum_ok") for r in results for g, v in r["extra"].items()}
    if sums:
        print(f"all-reduce result check: {'ok' if all(sums.values()) else 'WRONG'} on GPUs {sorted(sums)}")
    if args.json:
        args.json.write_text(json.dumps({"gpus": gpus, "topology": topo, "health": health, "phases": out,
                                         "rows": [dict(zip(ROW_HEADER, r)) for r in rows]}, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)  # the daemon's store and log, the all-reduce ranks' files
    return 0


if __name__ == "__main__":
    sys.exit(main())
