"""A job's ledger from its inputs (reports, placements, GPU samples; per-process activity when there is some): the
job's GPUs, their roles, and each GPU's cells interval by interval. Pure: the store reads are in
:mod:`trimtab.grading.ledger.read`."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from trimtab.contract.roles import RolePlacement
from trimtab.grading.ledger.attribute import GpuTrace, gpu_cells
from trimtab.grading.ledger.model import GpuKey, Ledger, LedgerRules
from trimtab.grading.ledger.timeline import scaled_note, step_spans

MAX_INTERVALS = 1000  # cells of one GPU a ledger may be cut into (the API refuses more)


def job_gpus(placements: Sequence[RolePlacement], device_map: Mapping[str, Iterable[int]], hostnames: Sequence[str],
             reported: Iterable[GpuKey]) -> tuple[GpuKey, ...]:
    """The job's GPUs: those its roles are placed on, its device map's (a one-node job), and those its ranks
    reported from."""
    gpus = {GpuKey(p.node, g) for p in placements for g in p.gpus}
    if len(hostnames) == 1:
        gpus |= {GpuKey(hostnames[0], int(g)) for gs in device_map.values() for g in gs}
    gpus |= set(reported)
    return tuple(sorted(gpus, key=lambda k: (k.hostname, k.gpu)))


def compute_ledger(job: str, start_ms: int, end_ms: int, interval_ms: int, reports: Iterable[Mapping[str, Any]],
                   placements: Sequence[RolePlacement], device_map: Mapping[str, Iterable[int]],
                   hostnames: Sequence[str], traces: Mapping[GpuKey, GpuTrace], rules: LedgerRules = LedgerRules(),
                   process_busy_pct: Optional[Mapping[tuple[str, int, int], float]] = None) -> Ledger:
    """The ledger of [start_ms, end_ms) cut into intervals of ``interval_ms`` (the last one shorter)."""
    if end_ms <= start_ms or interval_ms <= 0:
        raise ValueError(f"a ledger needs start < end and a positive interval, not [{start_ms}, {end_ms}) "
                         f"by {interval_ms} ms")
    if (end_ms - start_ms + interval_ms - 1) // interval_ms > MAX_INTERVALS:
        raise ValueError(f"{end_ms - start_ms} ms in intervals of {interval_ms} ms is more than {MAX_INTERVALS} "
                         f"intervals")
    spans, notes = step_spans(reports, placements, device_map, hostnames)
    gpus = job_gpus(placements, device_map, hostnames, (GpuKey(s.hostname, s.gpu) for s in spans))
    roles_by_gpu: dict[GpuKey, str] = {}
    for s in spans:
        roles_by_gpu.setdefault(GpuKey(s.hostname, s.gpu), s.role)
    for p in placements:
        for g in p.gpus:
            roles_by_gpu.setdefault(GpuKey(p.node, g), p.role)
    ledger = Ledger(job, start_ms, end_ms, interval_ms, gpus, notes=notes + scaled_note(spans))
    if not any(traces.get(g) and traces[g].ts_ms for g in gpus):
        ledger.notes.append("no GPU samples in the window: whom a wait was for is unknown")
    by_gpu: dict[GpuKey, list] = {g: [] for g in gpus}
    for s in spans:
        by_gpu[GpuKey(s.hostname, s.gpu)].append(s)
    for gpu in gpus:
        placed = [p for p in placements if p.node == gpu.hostname and gpu.gpu in p.gpus]
        for a in range(start_ms, end_ms, interval_ms):
            cells, more = gpu_cells(gpu, by_gpu[gpu], a, min(end_ms, a + interval_ms), placed, roles_by_gpu, traces,
                                    rules, process_busy_pct or {})
            ledger.cells.extend(cells)
            ledger.notes.extend(n for n in more if n not in ledger.notes)
    if not ledger.balanced(rules.balance_tolerance):
        raise AssertionError(f"ledger of {job!r} does not add up: busy {ledger.busy_gpu_s:.3f} + idle "
                             f"{ledger.idle_gpu_s:.3f} != wall {ledger.wall_gpu_s:.3f} GPU-s")
    return ledger
