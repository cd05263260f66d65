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
0,1,2,3`` prints the plan; ``tests/bench/test_multigpu_nvlink.py`` tests the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

PHASES = ("peer", "allreduce", "h2d", "idle")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SINGLE_GPU_TICK_US = 490.0     # BENCHMARKS.md: NvmlSource.sample() wall, median µs per GPU per tick (H200, run 1)
SINGLE_GPU_TICK_US_RUN2 = 589.2
GOAL_PCT = 5.0
GB = 1e9


# -- pure parts (importable without CUDA) ----------------------------------------------------------------------------

@dataclass
class Stream:
    """One load's traffic: ``link`` nvlink|pcie; the GPU it leaves (``tx_gpu``) and enters (``rx_gpu``), None for
    the host; ``marks`` (wall time s, cumulative bytes) after each synchronize, starting at (t0, 0)."""
    link: str
    tx_gpu: Optional[int]
    rx_gpu: Optional[int]
    marks: list = field(default_factory=list)


def ring_allreduce_bytes_per_rank(nbytes: float, world: int) -> float:
    """Bytes each rank sends (and receives) in one ring all-reduce of ``nbytes``: reduce-scatter then all-gather,
    (N−1) chunks of nbytes/N each way, twice."""
    if world < 1:
        raise ValueError("world must be ≥ 1")
    return 2.0 * (world - 1) / world * nbytes


def peer_ring_pairs(gpus: Sequence[int]) -> list[tuple[int, int]]:
    """(source, destination) per copy thread: GPU i → GPU (i+1) % N over the given GPUs; none for one GPU."""
    n = len(gpus)
    return [] if n < 2 else [(gpus[i], gpus[(i + 1) % n]) for i in range(n)]


def rate_in_window(marks: Sequence[tuple[float, float]], start: float, end: float) -> Optional[float]:
    """Bytes/s between the first mark at or after ``start`` and the last at or before ``end`` (None: fewer than
    two marks inside)."""
    inside = [(t, b) for t, b in marks if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def sample_window(start_s: float, end_s: float, interval_s: float, lead_s: float = 0.5,
                  trail_s: float = 0.5) -> Optional[tuple[int, int]]:
    """[start_ms, end_ms) of the agent samples that lie wholly inside a phase: a sample stamped t holds rates over
    (t − interval, t], so the first usable one is at start + interval (+ lead for jitter)."""
    lo, hi = start_s + interval_s + lead_s, end_s - trail_s
    if hi <= lo:
        return None
    return int(lo * 1000), int(hi * 1000)


def covered_span(window_ms: tuple[int, int], interval_s: float) -> tuple[float, float]:
    """The wall span (s) whose traffic the samples in ``window_ms`` average."""
    return window_ms[0] / 1000 - interval_s, window_ms[1] / 1000


def expected_rates(streams: Iterable[Stream], span: tuple[float, float]) -> dict[tuple[str, str, int], float]:
    """(link, "tx"|"rx", gpu) → bytes/s the loads moved in ``span``: each stream counts for its tx and rx GPU."""
    out: dict[tuple[str, str, int], float] = {}
    for s in streams:
        rate = rate_in_window(s.marks, *span)
        if rate is None:
            continue
        for direction, gpu in (("tx", s.tx_gpu), ("rx", s.rx_gpu)):
            if gpu is not None:
                out[(s.link, direction, gpu)] = out.get((s.link, direction, gpu), 0.0) + rate
    return out


def pct_diff(measured: Optional[float], reference: Optional[float]) -> Optional[float]:
    if measured is None or reference is None or reference == 0:
        return None
    return 100.0 * (measured - reference) / reference


def tick_cost_per_gpu_us(costs_s: Sequence[float], n_gpus: int) -> Optional[float]:
    """Median tick cost over a phase, per GPU, in µs."""
    costs = [c for c in costs_s if c is not None and c > 0]
    if not costs or n_gpus < 1:
        return None
    return statistics.median(costs) * 1e6 / n_gpus


def costs_in(polls: Sequence[tuple[float, int, float]], start: float, end: float) -> list[float]:
    """One cost per distinct tick seen by the /healthz polls ((time, ticks, last_tick_cost_s)) within a span."""
    seen: dict[int, float] = {}
    for t, ticks, cost in polls:
        if start <= t <= end and ticks not in seen:
            seen[ticks] = cost
    return list(seen.values())


def _g(v: Optional[float]) -> str:
    return "-" if v is None else f"{v / GB:.2f}"


def _p(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.1f}"


def verdict(diff: Optional[float], goal: float = GOAL_PCT) -> str:
    return "" if diff is None else ("ok" if abs(diff) <= goal else "OFF")


ROW_HEADER = ["phase", "GPU", "n", "agent NVLink TX", "load TX", "Δ TX %", "agent NVLink RX", "load RX", "Δ RX %",
              "NVML data TX/RX", "agent PCIe TX", "agent PCIe RX", "load PCIe RX", "Δ PCIe RX %", "util %",
              "tick µs/GPU"]


def phase_rows(phase: str, gpus: Sequence[int], agent: Mapping[int, Mapping], expected: Mapping,
               nvml_counters: Mapping[int, tuple], tick_us: Optional[float]) -> list[list[str]]:
    """Table rows of one phase (GB/s = 10⁹ B/s). ``agent``: gpu → {metric: mean, "n": samples}; ``nvml_counters``:
    gpu → (tx B/s, rx B/s) from NVML's payload counters, or absent."""
    rows = []
    for gpu in gpus:
        a = agent.get(gpu, {})
        tx, rx = a.get("nvlink_tx_bytes_per_s"), a.get("nvlink_rx_bytes_per_s")
        ltx, lrx = expected.get(("nvlink", "tx", gpu)), expected.get(("nvlink", "rx", gpu))
        prx = expected.get(("pcie", "rx", gpu))
        dtx, drx, dp = pct_diff(tx, ltx), pct_diff(rx, lrx), pct_diff(a.get("pcie_rx_bytes_per_s"), prx)
        ntx, nrx = nvml_counters.get(gpu, (None, None))
        util = a.get("util_pct")
        rows.append([phase, str(gpu), str(a.get("n", 0)),
                     "unsupported" if tx is None and a.get("n") else _g(tx), _g(ltx), f"{_p(dtx)} {verdict(dtx)}".strip(),
                     "unsupported" if rx is None and a.get("n") else _g(rx), _g(lrx), f"{_p(drx)} {verdict(drx)}".strip(),
                     f"{_g(ntx)} / {_g(nrx)}", _g(a.get("pcie_tx_bytes_per_s")), _g(a.get("pcie_rx_bytes_per_s")),
                     _g(prx), _p(dp), "-" if util is None else f"{util:.0f}",
                     "-" if tick_us is None else f"{tick_us:.0f}"])
    return rows


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def plan_text(gpus: Optional[Sequence[int]], phases: Sequence[str], phase_s: float, peer_mib: int, ar_mib: int,
              h2d_mib: int, nccl_algo: str, nccl_proto: str, interval_s: float = 1.0) -> str:
    n = len(gpus) if gpus else None
    shown = list(gpus) if gpus else [0, 1, 2, 3]
    nn = len(shown)
    lines = [f"GPUs: {shown if gpus else 'all visible (shown for 4: ' + str(shown) + ')'}; phases "
             f"{', '.join(phases)} × {phase_s:g} s; agent `trimtab up --interval {interval_s:g}`",
             "env: " + " ".join(f"{k}={v}" for k, v in SAFE_ENV.items())
             + (f" NCCL_ALGO={nccl_algo}" if nccl_algo else "") + (f" NCCL_PROTO={nccl_proto}" if nccl_proto else "")]
    for ph in phases:
        if ph == "peer":
            lines.append(f"peer: pairs {peer_ring_pairs(shown)}, {peer_mib} MiB per copy; GPU i TX = rate(i→i+1), "
                         f"RX = rate(i−1→i)")
        elif ph == "allreduce":
            lines.append(f"allreduce: {nn} NCCL ranks, {ar_mib} MiB per all-reduce → "
                         f"{ring_allreduce_bytes_per_rank(ar_mib * 2**20, nn) / 2**20:.0f} MiB sent and received "
                         f"per rank per all-reduce (2(N−1)/N × size)")
        elif ph == "h2d":
            lines.append(f"h2d: pinned host → GPU copies of {h2d_mib} MiB on every GPU at once: PCIe RX")
        elif ph == "idle":
            lines.append("idle: nothing; NVLink ≈ 0")
    w = sample_window(0.0, phase_s, interval_s)
    lines.append(f"windows: agent samples stamped in [start + {w[0] / 1000:g} s, start + {w[1] / 1000:g} s) of "
                 f"each phase (≈ {int((w[1] - w[0]) / 1000 / interval_s)} samples per GPU)" if w
                 else "windows: phase too short for a whole sample")
    if n is None:
        lines.append("(dry run: no CUDA touched)")
    return "\n".join(lines)


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


# -- references: NVML's payload counters, the daemon's tick cost --------------------------------------------------------

class NvlinkCounters:
    """NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (cumulative KiB, summed over links) per GPU, read on demand."""

    def __init__(self, gpus: Sequence[int]):
        self.ok = False
        try:
            import pynvml as nv

            from trimtab.agent.nvml.slow import field_number  # noqa: F401  (the union member valueType names)

            nv.nvmlInit()
            self.nv, self.handles = nv, {g: nv.nvmlDeviceGetHandleByIndex(g) for g in gpus}
            self.ok = True
        except Exception as exc:  # a reference only: the bench goes on without it
            print(f"NVML payload counters unavailable: {exc}", flush=True)

    def read(self) -> dict[int, Optional[tuple[float, float, float]]]:
        """gpu → (time s, tx KiB, rx KiB), None where unsupported."""
        from trimtab.agent.nvml.slow import field_number
        out: dict[int, Optional[tuple[float, float, float]]] = {}
        if not self.ok:
            return out
        nv = self.nv
        for g, h in self.handles.items():
            try:
                vals = nv.nvmlDeviceGetFieldValues(h, [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
                                                       (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF)])
                if any(v.nvmlReturn != nv.NVML_SUCCESS for v in vals):
                    out[g] = None
                    continue
                num = [field_number(v) for v in vals]
                out[g] = (time.time(), float(num[0]), float(num[1]))
            except Exception:
                out[g] = None
        return out

    @staticmethod
    def rates(a: Mapping, b: Mapping) -> dict[int, tuple[float, float]]:
        out = {}
        for g in a:
            if a.get(g) and b.get(g) and b[g][0] > a[g][0]:
                dt = b[g][0] - a[g][0]
                out[g] = ((b[g][1] - a[g][1]) * 1024 / dt, (b[g][2] - a[g][2]) * 1024 / dt)
        return out


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
