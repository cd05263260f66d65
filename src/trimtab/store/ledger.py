"""The store's side of the GPU-time ledger (trimtab.grading.ledger): a job's step reports and its GPUs' utilization
in a window, each one indexed range read (no scan of the job's history), and the accumulated ledger behind the
/metrics counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from sqlalchemy import Engine, and_, case, func, or_, select, tuple_, union_all, update

from trimtab.store.inserts import insert_for
from trimtab.store.models import (gpu_processes, gpu_samples, gpus, job_gpu_ledger, job_ledger_state, job_reports, jobs,
                                  nodes)
from trimtab.store.transactions import write_transaction

# What the ledger reads of a report: when it ended, how long it took, its phases, who ran it where.
_PHASE_COLUMNS = tuple(c.name for c in job_reports.columns if c.name.endswith("_s") and c.name != "step_time_s")
LEDGER_REPORT_COLUMNS = ("rank", "step", "received_ms", "step_time_s", "pid", "hostname", "local_gpu",
                         *_PHASE_COLUMNS)
AFTER_WINDOW_PER_RANK = 2  # reports past the window's end read per rank (the step that covers its tail)


def window_reports(engine: Engine, job_id: int, ranks: int, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """The job's reports stamped in [start_ms, end_ms], and the first few after it (a step that ends after the
    window covers its tail)."""
    return window_reports_many(engine, {job_id: (ranks, start_ms, end_ms)}).get(job_id, [])


def window_reports_many(engine: Engine, windows: Mapping[int, tuple[int, int, int]]) -> dict[int, list[dict[str, Any]]]:
    """For each job (id → (ranks, start_ms, end_ms)): its reports stamped in its window and the first few after
    it. Two statements whatever the number of jobs, each job's part a range read of the (job, received_ms)
    index."""
    out: dict[int, list[dict[str, Any]]] = {job_id: [] for job_id in windows}
    if not windows:
        return out
    r = job_reports.c
    cols = [r.job_id, *(r[c] for c in LEDGER_REPORT_COLUMNS)]
    inside = select(*cols).where(or_(*(and_(r.job_id == job_id, r.received_ms >= start, r.received_ms <= end)
                                       for job_id, (_, start, end) in windows.items())))
    parts = [select(*cols).where(r.job_id == job_id, r.received_ms > end).order_by(r.received_ms)
             .limit(AFTER_WINDOW_PER_RANK * max(1, ranks)).subquery()
             for job_id, (ranks, _, end) in windows.items()]
    after = union_all(*(select(p) for p in parts))
    with engine.connect() as conn:
        for q in (inside, after):
            for row in conn.execute(q).mappings():
                out[row["job_id"]].append({c: row[c] for c in LEDGER_REPORT_COLUMNS})
    return out


def utilization(engine: Engine, gpu_keys: Iterable[tuple[str, int]], start_ms: int,
                end_ms: int) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(node, GPU index) → its utilization samples in [start_ms, end_ms] as (ts_ms, util %), oldest first: a
    range read of each GPU's (gpu, time) key. NULL utilization (unsupported) is left out."""
    return utilization_and_activity(engine, gpu_keys, start_ms, end_ms, activity=False)[0]


def utilization_and_activity(engine: Engine, gpu_keys: Iterable[tuple[str, int]], start_ms: int, end_ms: int,
                             activity: bool = True) -> tuple[dict, dict]:
    """:func:`utilization`, and (``activity``) each GPU's per-process activity over the same window: (node, GPU
    index) → pid → (busy seconds, covered seconds) over its process rows taken in [start_ms, end_ms] whose activity
    is known (NULL: unknown, left out): a row's SM % is the process's mean over (util_from_ms, util_to_ms]
    (``trimtab.agent.activity``), so its busy seconds are ``sm_util_pct / 100 × (util_to_ms − util_from_ms) / 1000``.
    One range read of each table's (gpu, time) key."""
    keys = sorted(set(gpu_keys))
    out: dict[tuple[str, int], list[tuple[int, float]]] = {k: [] for k in keys}
    busy: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}
    if not keys:
        return out, busy
    with engine.connect() as conn:
        ids = {row.id: (row.hostname, row.gpu_index) for row in conn.execute(
            select(gpus.c.id, gpus.c.gpu_index, nodes.c.hostname).select_from(gpus.join(nodes))
            .where(tuple_(nodes.c.hostname, gpus.c.gpu_index).in_(keys)))}
        if not ids:
            return out, busy
        s = gpu_samples.c
        rows = conn.execute(select(s.gpu_id, s.ts_ms, s.util_pct)
                            .where(s.gpu_id.in_(list(ids)), s.ts_ms >= start_ms, s.ts_ms <= end_ms,
                                   s.util_pct.is_not(None)).order_by(s.gpu_id, s.ts_ms))
        for gpu_id, ts_ms, util in rows:
            out[ids[gpu_id]].append((int(ts_ms), float(util)))
        if activity:
            p = gpu_processes.c
            covered_ms = p.util_to_ms - p.util_from_ms
            for gpu_id, pid, sm_x_ms, ms in conn.execute(
                    select(p.gpu_id, p.pid, func.sum(p.sm_util_pct * covered_ms), func.sum(covered_ms))
                    .where(p.gpu_id.in_(list(ids)), p.ts_ms >= start_ms, p.ts_ms <= end_ms,
                           p.sm_util_pct.is_not(None), p.util_from_ms.is_not(None), p.util_to_ms.is_not(None))
                    .group_by(p.gpu_id, p.pid)):
                busy.setdefault(ids[gpu_id], {})[int(pid)] = (float(sm_x_ms or 0.0) / 100_000, float(ms or 0) / 1000)
    return out, busy


@dataclass(frozen=True)
class LedgerRow:
    """One accumulated cell: a job's GPU-seconds on one GPU by kind, role and phase or cause."""

    job: str
    hostname: str
    gpu_index: int
    kind: str
    role: str
    name: str
    waiting_for: str
    gpu_s: float


def ledger_through(engine: Engine, job_ids: Sequence[int]) -> dict[int, int]:
    """Job id → the time up to which its accumulated ledger has been added (jobs never accumulated: absent)."""
    if not job_ids:
        return {}
    with engine.connect() as conn:
        return dict(conn.execute(select(job_ledger_state.c.job_id, job_ledger_state.c.through_ms)
                                 .where(job_ledger_state.c.job_id.in_(list(job_ids)))).all())


def accumulate(engine: Engine, advances: Mapping[int, tuple[Optional[int], int, Mapping[tuple, float]]]) -> bool:
    """For each job (id → (from_ms, through_ms, cells)): adds ``cells`` ((node, GPU, kind, role, name,
    waiting_for) → GPU-seconds) to its accumulated ledger and moves it from ``from_ms`` (None: never accumulated)
    to ``through_ms`` — all in one transaction of three statements, and only if every job is still where it was
    read (compare-and-set): when another server advanced any of them first, nothing is added (False) and the next
    advance starts from where that one left off."""
    if not advances:
        return True
    new = [{"job_id": j, "through_ms": t} for j, (f, t, _) in advances.items() if f is None]
    moved = {j: (f, t) for j, (f, t, _) in advances.items() if f is not None}
    try:
        _accumulate(engine, new, moved, advances)
    except _LostRace:
        return False
    return True


class _LostRace(Exception):
    """Another server advanced a job first: the transaction rolls back."""


def _accumulate(engine: Engine, new: list, moved: dict, advances: Mapping) -> None:
    st = job_ledger_state.c
    with write_transaction(engine) as conn:
        done = 0
        if new:  # the rows RETURNING gives, not rowcount: PostgreSQL's driver answers -1 for a multi-row insert
            done += len(conn.execute(insert_for(conn.dialect, job_ledger_state).on_conflict_do_nothing().values(new)
                                     .returning(st.job_id)).all())
        if moved:
            done += conn.execute(update(job_ledger_state)
                                 .where(tuple_(st.job_id, st.through_ms).in_([(j, f) for j, (f, _) in moved.items()]))
                                 .values(through_ms=case({j: t for j, (_, t) in moved.items()}, value=st.job_id))
                                 ).rowcount
        if done != len(advances):
            raise _LostRace()
        rows = [{"job_id": j, "hostname": h, "gpu_index": g, "kind": k, "role": r, "name": n, "waiting_for": w,
                 "gpu_s": v} for j, (_, _, cells) in advances.items() for (h, g, k, r, n, w), v in cells.items()
                if v > 0]
        if rows:
            stmt = insert_for(conn.dialect, job_gpu_ledger)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=[job_gpu_ledger.c[c] for c in ("job_id", "hostname", "gpu_index", "kind", "role",
                                                              "name", "waiting_for")],
                set_={"gpu_s": job_gpu_ledger.c.gpu_s + stmt.excluded.gpu_s}), rows)


def accumulated(engine: Engine, job_ids: Optional[Sequence[int]] = None) -> list[LedgerRow]:
    """The accumulated ledger of the jobs (all jobs: None), ordered by job, GPU and cell."""
    l = job_gpu_ledger.c
    query = (select(jobs.c.name, l.hostname, l.gpu_index, l.kind, l.role, l.name, l.waiting_for, l.gpu_s)
             .select_from(job_gpu_ledger.join(jobs, jobs.c.id == l.job_id))
             .order_by(jobs.c.name, l.hostname, l.gpu_index, l.kind, l.role, l.name, l.waiting_for))
    if job_ids is not None:
        query = query.where(l.job_id.in_(list(job_ids)))
    with engine.connect() as conn:
        return [LedgerRow(*row) for row in conn.execute(query)]


__all__ = ["LEDGER_REPORT_COLUMNS", "LedgerRow", "accumulate", "accumulated", "ledger_through", "utilization",
           "utilization_and_activity", "window_reports", "window_reports_many"]
