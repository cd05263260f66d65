"""The ledger from the store: a job's ledger over a window (``GET /v1/jobs/{name}/gpu-time``), and the accumulated
ledger behind /metrics' counters, advanced by the time since its last advance (never a sliding window: a counter
must not go down, and an advance must not re-read history; the server's ticker advances it, :mod:`.ticker`).

What a window reads: the job's reports stamped in it (plus the first ones after it, whose steps cover its tail) and
its GPUs' utilization samples in it — range reads of the (job, received_ms) index and each GPU's (gpu, time) key,
O(GPUs × window) whatever the job's age.
"""

from __future__ import annotations

from typing import Optional, Sequence

from sqlalchemy import Engine

from trimtab.grading.ledger.attribute import GpuTrace
from trimtab.grading.ledger.compute import compute_ledger
from trimtab.grading.ledger.model import GpuKey, Ledger, LedgerRules
from trimtab.grading.ledger.shares import busy_pct_by_process
from trimtab.store import ledger as ledger_store
from trimtab.store.jobs import StoredJob

TRACE_LOOKBACK_MS = 10_000  # samples before the window: the state of the other GPUs at its first ticks
SETTLE_MS = 10_000          # the accumulated ledger stays this far behind now (reports in flight)
LIVE_MS = 300_000           # a job that reported within this long is live: its ledger keeps advancing
# One advance adds at most this much, and a job seen for the first time starts at most this far back: a tick after
# an outage of the daemon catches up a few minutes at a time (the counters lag rather than one tick holding the
# store for long; bench/gpu_ledger.py: 15 minutes of 8 jobs took one advance 5.4 s on the 2-core dev machine).
MAX_ADVANCE_MS = 300_000


def job_gpu_keys(job: StoredJob, reports: Sequence[dict]) -> set[tuple[str, int]]:
    """(node, GPU index) of the job's GPUs: its roles', its device map's (one node), and those its reports name."""
    keys = {(p.node, g) for p in job.roles for g in p.gpus}
    single = job.hostnames[0] if len(job.hostnames) == 1 else None
    if single:
        keys |= {(single, int(g)) for gs in job.device_map.values() for g in gs}
    keys |= {(r.get("hostname") or single, int(r["local_gpu"])) for r in reports
             if r.get("local_gpu") is not None and (r.get("hostname") or single)}
    return keys


def _traces(engine: Engine, keys, start_ms: int, end_ms: int) -> tuple[dict[GpuKey, GpuTrace], dict]:
    """The GPUs' utilization traces (from ``TRACE_LOOKBACK_MS`` before the window) and their per-process activity
    in the window (:mod:`.shares`)."""
    samples, activity = ledger_store.utilization_and_activity(engine, keys, start_ms - TRACE_LOOKBACK_MS, end_ms)
    traces = {GpuKey(h, g): GpuTrace([t for t, _ in rows], [u for _, u in rows]) for (h, g), rows in samples.items()}
    return traces, activity


def job_ledger(engine: Engine, job: StoredJob, start_ms: int, end_ms: int, interval_ms: Optional[int] = None,
               rules: LedgerRules = LedgerRules(),
               process_busy_pct: Optional[dict[tuple[str, int, int], float]] = None) -> Ledger:
    """The job's ledger over [start_ms, end_ms), cut into intervals of ``interval_ms`` (one interval: None), from
    the job's registration on (before it, its GPUs' time is not the job's: the ledger starts there and says so).
    ``process_busy_pct``: each process's busy % of the window (None: from the store's per-process activity, as
    :mod:`.shares` estimates it)."""
    if job.created_ms >= end_ms:
        return Ledger(job.name, end_ms, end_ms, interval_ms or 1, (),
                      notes=[f"job {job.name!r} registered after the window's end"])
    clipped = job.created_ms > start_ms
    start_ms = max(start_ms, job.created_ms)
    reports = ledger_store.window_reports(engine, job.id, job.ranks, start_ms, end_ms)
    traces, activity = _traces(engine, job_gpu_keys(job, reports), start_ms, end_ms)
    if process_busy_pct is None:
        process_busy_pct = busy_pct_by_process(activity)
    ledger = compute_ledger(job.name, start_ms, end_ms, interval_ms or (end_ms - start_ms), reports, job.roles,
                            job.device_map, job.hostnames, traces, rules, process_busy_pct)
    if clipped:
        ledger.notes.insert(0, f"the window starts at the job's registration ({start_ms} ms), after the start asked")
    return ledger


def _due(job: StoredJob, done: Optional[int], now_ms: int) -> Optional[tuple[int, int]]:
    """The span [start, end) the job's accumulated ledger advances by now, or None."""
    start = done if done is not None else max(job.created_ms, now_ms - MAX_ADVANCE_MS)
    last = job.last_report_ms
    if done is not None and (last is None or last <= done) and now_ms - done > LIVE_MS:
        return None  # stopped: nothing new since its last advance
    end = now_ms - SETTLE_MS
    if last is not None and now_ms - last < LIVE_MS:
        end = min(end, last)
    end = min(end, start + MAX_ADVANCE_MS)
    return (start, end) if end > start else None


def advance_ledgers(engine: Engine, jobs: Sequence[StoredJob], now_ms: int,
                    rules: LedgerRules = LedgerRules()) -> int:
    """Adds to each live job's accumulated ledger the time since its last advance, up to ``SETTLE_MS`` before now
    and no later than its newest report (a step still running is not in the store yet). A job seen for the first
    time starts at its registration, at most ``MAX_ADVANCE_MS`` back. A constant number of statements whatever the
    number of jobs (their reports, their GPUs' samples, one transaction). Returns how many jobs advanced (0 when
    another server advanced one of them first: the next call goes on from there)."""
    through = ledger_store.ledger_through(engine, [j.id for j in jobs])
    due = {j.id: (j, through.get(j.id), span) for j in jobs if (span := _due(j, through.get(j.id), now_ms))}
    if not due:
        return 0
    reports = ledger_store.window_reports_many(engine, {i: (j.ranks, *span) for i, (j, _, span) in due.items()})
    keys = set().union(*(job_gpu_keys(j, reports[i]) for i, (j, _, _) in due.items()))
    first, last = min(s for _, _, (s, _) in due.values()), max(e for _, _, (_, e) in due.values())
    traces, activity = _traces(engine, keys, first, last)
    busy_pct = busy_pct_by_process(activity)  # one busy % over the ticks' span (see .shares)
    advances = {}
    for job_id, (job, done, (start, end)) in due.items():
        ledger = compute_ledger(job.name, start, end, end - start, reports[job_id], job.roles, job.device_map,
                                job.hostnames, traces, rules, busy_pct)
        advances[job_id] = (done, end, _summed(ledger))
    return len(advances) if ledger_store.accumulate(engine, advances) else 0


def _summed(ledger: Ledger) -> dict[tuple[str, int, str, str, str, str], float]:
    out: dict[tuple[str, int, str, str, str, str], float] = {}
    for c in ledger.cells:
        key = (c.hostname, c.gpu, c.kind, c.role, c.name, c.waiting_for)
        out[key] = out.get(key, 0.0) + c.gpu_s
    return out
