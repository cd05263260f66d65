"""The arithmetic of ``bench/multigpu_nvlink.py``, importable without CUDA (``tests/bench/test_multigpu_nvlink.py``
tests it): the bytes a ring all-reduce moves per rank, which GPU pairs a peer ring uses, a load's rate over the span
the agent's samples cover, the rates each GPU should read, the differences against them, and the tables; and the
second reference beside the agent, NVML's own NVLink payload counters.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GOAL_PCT = 5.0
GB = 1e9


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


# -- the second reference: NVML's own payload counters (pynvml imported when one is made) ----------------------------

class NvlinkCounters:
    """NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (cumulative KiB, summed over links) per GPU, read on demand."""

    def __init__(self, gpus: Sequence[int]):
        self.ok = False
        try:
            import pynvml as nv

            from trimtab.agent.nvml.slow import field_number  # reads the union member its valueType names

            nv.nvmlInit()
            self.nv, self.field_number = nv, field_number
            self.handles = {g: nv.nvmlDeviceGetHandleByIndex(g) for g in gpus}
            self.ok = True
        except Exception as exc:  # a reference only: the bench goes on without it
            print(f"NVML payload counters unavailable: {exc}", flush=True)

    def read(self) -> dict[int, Optional[tuple[float, float, float]]]:
        """gpu → (time s, tx KiB, rx KiB), None where unsupported."""
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
                num = [self.field_number(v) for v in vals]
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
