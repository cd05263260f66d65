"""The store's side of the GPU-time ledger (trimtab.grading.ledger): a job's step reports and its GPUs' utilization
in a window, each one indexed range read (no scan of the job's history), and the accumulated ledger behind the
/metrics counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from sqlalchemy import Engine, select, tuple_, update

from trimtab.store.engine import insert_for, write_transaction
from trimtab.store.models import gpu_samples, gpus, job_gpu_ledger, job_ledger_state, job_reports, jobs, nodes

# What the ledger reads of a report: when it ended, how long it took, its phases, who ran it where.
_PHASE_COLUMNS = tuple(c.name for c in job_reports.columns if c.name.endswith("_s") and c.name != "step_time_s")
LEDGER_REPORT_COLUMNS = ("rank", "step", "received_ms", "step_time_s", "pid", "hostname", "local_gpu",
                         *_PHASE_COLUMNS)
AFTER_WINDOW_PER_RANK = 2  # reports past the window's end read per rank (the step that covers its tail)


def window_reports(engine: Engine, job_id: int, ranks: int, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """The job's reports stamped in [start_ms, end_ms], and the first few after it (a step that ends after the
    window covers its tail). Two range reads of the (job, received_ms) index."""
    r = job_reports.c
    cols = [r[c] for c in LEDGER_REPORT_COLUMNS]
    inside = select(*cols).where(r.job_id == job_id, r.received_ms >= start_ms, r.received_ms <= end_ms)
    after = (select(*cols).where(r.job_id == job_id, r.received_ms > end_ms).order_by(r.received_ms)
             .limit(AFTER_WINDOW_PER_RANK * max(1, ranks)))
    with engine.connect() as conn:
        return [dict(row) for q in (inside, after) for row in conn.execute(q).mappings()]


def utilization(engine: Engine, gpu_keys: Iterable[tuple[str, int]], start_ms: int,
                end_ms: int) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(node, GPU index) → its utilization samples in [start_ms, end_ms] as (ts_ms, util %), oldest first: a
    range read of each GPU's (gpu, time) key. NULL utilization (unsupported) is left out."""
    keys = sorted(set(gpu_keys))
    out: dict[tuple[str, int], list[tuple[int, float]]] = {k: [] for k in keys}
    if not keys:
        return out
    with engine.connect() as conn:
        ids = {row.id: (row.hostname, row.gpu_index) for row in conn.execute(
            select(gpus.c.id, gpus.c.gpu_index, nodes.c.hostname).select_from(gpus.join(nodes))
            .where(tuple_(nodes.c.hostname, gpus.c.gpu_index).in_(keys)))}
        if not ids:
            return out
        s = gpu_samples.c
        rows = conn.execute(select(s.gpu_id, s.ts_ms, s.util_pct)
                            .where(s.gpu_id.in_(list(ids)), s.ts_ms >= start_ms, s.ts_ms <= end_ms,
                                   s.util_pct.is_not(None)).order_by(s.gpu_id, s.ts_ms))
        for gpu_id, ts_ms, util in rows:
            out[ids[gpu_id]].append((int(ts_ms), float(util)))
    return out


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


def accumulate(engine: Engine, job_id: int, from_ms: Optional[int], through_ms: int,
               cells: Mapping[tuple[str, int, str, str, str, str], float]) -> bool:
    """Adds ``cells`` ((node, GPU, kind, role, name, waiting_for) → GPU-seconds) to the job's accumulated ledger
    and moves it from ``from_ms`` (None: never accumulated) to ``through_ms``, in one transaction, only if it is
    still at ``from_ms`` (another server that added the same time first wins; this one adds nothing: False)."""
    with write_transaction(engine) as conn:
        st = job_ledger_state.c
        if from_ms is None:
            done = conn.execute(insert_for(conn.dialect, job_ledger_state).on_conflict_do_nothing()
                                .values(job_id=job_id, through_ms=through_ms)).rowcount
        else:
            done = conn.execute(update(job_ledger_state).where(st.job_id == job_id, st.through_ms == from_ms)
                                .values(through_ms=through_ms)).rowcount
        if done != 1:
            return False
        rows = [{"job_id": job_id, "hostname": h, "gpu_index": g, "kind": k, "role": r, "name": n,
                 "waiting_for": w, "gpu_s": v} for (h, g, k, r, n, w), v in cells.items() if v > 0]
        if rows:
            stmt = insert_for(conn.dialect, job_gpu_ledger)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=[job_gpu_ledger.c[c] for c in ("job_id", "hostname", "gpu_index", "kind", "role",
                                                              "name", "waiting_for")],
                set_={"gpu_s": job_gpu_ledger.c.gpu_s + stmt.excluded.gpu_s}), rows)
    return True


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
           "window_reports"]
