"""Per-process busy shares of a GPU from NVML's per-process activity, for the ledger's roles that send no step
reports (alone on a GPU, or sharing one with a reporting rank): each process's busy seconds over the time its
process rows cover, as a % of that time.

A row's SM % is the process's mean over the interval the row covers (``trimtab.agent.activity``: each NVML record
is an average over the time since the previous read, and the agent adds ``smUtil × covered`` up), so the process
was busy ``sm_util_pct / 100 × covered seconds`` in it; summed over its rows in the window and divided by the time
they cover, that is its busy % — the agent's attribution, applied to the window's wall time. On an H100 the same
reading of NVML's records (smUtil × the time since the process's previous record) came to 0.94× and 1.06× two
processes' own CUDA-event totals (bench/process_activity.py); reading a record as one sampling period instead
undercounted about five-fold, which is why an earlier version scaled shares by the GPU's utilization instead.

Still an estimate (the cell says so): NVML gives whole percent, its records cover the agent's reads rather than the
window's edges, and a process's rows stand for the whole window. And the driver splits a shared GPU only as finely
as its sampling period: measured on an H100 (driver 580.159.04, 2026-12-06, ``process_activity.py --dump``), each
200 ms device sample is credited whole to the process that ran last before its instant (203 of 204 samples), so of
two processes taking turns back to back the newcomer gets the other's tail, about half a period per turn. With
120/300 ms turns that is 0.81–0.94× and 1.01–1.07× the two processes' own totals, and the agent reads within 2 % of
that rule's own figures (the bench's estimator (d)); the error falls as turns lengthen toward RL phases of seconds.
"""

from __future__ import annotations

from typing import Mapping

HOW = ("its processes' mean SM utilization over the time NVML's per-process records cover (each record's smUtil × "
       "the seconds it covers, summed) × the window")


def busy_pct_by_process(activity: Mapping[tuple[str, int], Mapping[int, tuple[float, float]]]
                        ) -> dict[tuple[str, int, int], float]:
    """(node, GPU, pid) → the process's busy % of the time its rows cover. ``activity``: (node, GPU) → pid →
    (busy seconds, covered seconds), as ``trimtab.store.ledger.utilization_and_activity`` sums them. A pid whose
    rows cover no time gets none (nothing known)."""
    out: dict[tuple[str, int, int], float] = {}
    for (host, gpu), pids in activity.items():
        for pid, (busy_s, covered_s) in pids.items():
            if covered_s > 0:
                out[(host, gpu, pid)] = min(100.0, 100.0 * busy_s / covered_s)
    return out
