"""Per-process busy shares of a GPU from NVML's per-process activity, for the ledger's roles that send no step
reports (alone on a GPU, or sharing one with a reporting rank): each process's share of the GPU's summed
per-process SM utilization over the window × the GPU's mean utilization over it.

Why not each process's own ``mean smUtil × samples × period``: on an H100 that read 0.28× and 0.17× of two
processes' own CUDA-event busy totals (bench/process_activity.py): NVML's per-process samples are not a busy-time
record at its sampling. Their *proportions* are what they can give; the GPU's own utilization gives the total. So
the figure is an estimate (the cell says so, and the ledger's notes say how it was made), over the window as a
whole (a process busy early and another late in it get the window's shares in every interval).
"""

from __future__ import annotations

from typing import Mapping

from trimtab.grading.ledger.attribute import GpuTrace
from trimtab.grading.ledger.model import GpuKey

HOW = ("each process's share of the GPU's summed per-process SM utilization (NVML's per-process samples) over the "
       "window × the GPU's mean utilization over it")


def busy_pct_by_process(activity: Mapping[tuple[str, int], Mapping[int, tuple[float, int]]],
                        traces: Mapping[GpuKey, GpuTrace], start_ms: float,
                        end_ms: float) -> dict[tuple[str, int, int], float]:
    """(node, GPU, pid) → the process's busy % of the window. ``activity``: (node, GPU) → pid → (Σ smUtil ×
    samples, Σ samples). A GPU without utilization samples in the window gets none (no total to share)."""
    out: dict[tuple[str, int, int], float] = {}
    for (host, gpu), pids in activity.items():
        trace = traces.get(GpuKey(host, gpu))
        mean = trace.mean_pct(start_ms, end_ms) if trace is not None else None
        total = sum(sm for sm, _ in pids.values())
        if mean is None:
            continue
        for pid, (sm, n) in pids.items():
            if n > 0:
                out[(host, gpu, pid)] = mean * sm / total if total > 0 else 0.0
    return out
