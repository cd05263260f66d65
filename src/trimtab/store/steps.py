"""Step reports as their readers want them: a job's newest complete steps with every rank's report, its first
collective-latency probes, and whether any job reported lately.

A step is complete once every rank has reported it, or once a later step has arrived (the missing rank's report
is then lost, not late). Reports come back as plain dicts of the contract's columns (plus ``received_ms``), so
the readers fold them without knowing the table.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sqlalchemy import Engine, bindparam, func, select, union_all

from trimtab.contract.step_report import COLUMNS
from trimtab.store.models import job_reports, jobs

STEP_COLUMNS = ("received_ms", *COLUMNS)

Report = dict[str, Any]


def complete_steps(engine: Engine, ranks_by_job: Mapping[int, int], depth: int,
                   since_step: int = 0) -> dict[int, list[tuple[int, list[Report]]]]:
    """For each job (id → its ranks): its newest ``depth`` reported steps at or after ``since_step`` that are
    complete, oldest first, each as (step, the ranks' reports in rank order). One query, whatever the number of
    jobs; each job's part reads its (job, step, rank) index from the step ``depth`` steps below its newest."""
    if not ranks_by_job or depth <= 0:
        return {}
    r, newer = job_reports.c, job_reports.alias("newer")
    lowest = (select(newer.c.step).where(newer.c.job_id == jobs.c.id, newer.c.step >= since_step)
              .group_by(newer.c.step).order_by(newer.c.step.desc()).limit(1).offset(depth - 1).scalar_subquery())
    floors = (select(jobs.c.id.label("job_id"), lowest.label("lowest"))
              .where(jobs.c.id.in_(list(ranks_by_job))).subquery())
    query = (select(r.job_id, *(r[c] for c in STEP_COLUMNS))
             .select_from(job_reports.join(floors, r.job_id == floors.c.job_id))
             .where(r.step >= func.coalesce(floors.c.lowest, since_step))
             .order_by(r.job_id, r.step, r.rank))
    by_job: dict[int, dict[int, list[Report]]] = {}
    with engine.connect() as conn:
        for row in conn.execute(query).mappings():
            by_job.setdefault(row["job_id"], {}).setdefault(row["step"], []).append(dict(row))
    out: dict[int, list[tuple[int, list[Report]]]] = {}
    for job_id, by_step in by_job.items():
        newest = max(by_step)
        out[job_id] = [(step, reports) for step, reports in sorted(by_step.items())
                       if len({x["rank"] for x in reports}) >= ranks_by_job[job_id] or step < newest]
    return out


def first_probes(engine: Engine, wanted: Mapping[int, int]) -> dict[int, list[float]]:
    """For each job (id → how many): its first collective-latency probe values in step and rank order, at most
    that many (fewer while it has probed less). One query; each job's part stops at its n-th probe."""
    wanted = {job_id: n for job_id, n in wanted.items() if n > 0}
    out: dict[int, list[float]] = {job_id: [] for job_id in wanted}
    if not wanted:
        return out
    r = job_reports.c
    parts = [select(r.job_id, r.collective_latency_us, r.step, r.rank)
             .where(r.job_id == job_id, r.collective_latency_us.is_not(None))
             .order_by(r.step, r.rank).limit(n).subquery() for job_id, n in wanted.items()]
    probes = union_all(*(select(p) for p in parts)).subquery()
    query = select(probes.c.job_id, probes.c.collective_latency_us).order_by(probes.c.job_id, probes.c.step,
                                                                             probes.c.rank)
    with engine.connect() as conn:
        for job_id, value in conn.execute(query):
            out[job_id].append(float(value))
    return out


def any_report_since(engine: Engine, since_ms: int) -> bool:
    """Did any job's report arrive at or after ``since_ms``? One indexed lookup."""
    query = select(job_reports.c.id).where(job_reports.c.received_ms >= since_ms).limit(1)
    with engine.connect() as conn:
        return conn.execute(query).first() is not None


def steps_since(engine: Engine, job_id: int, after_step: int) -> tuple[int, float]:
    """(steps, seconds of step time) the job has reported after ``after_step``: each step once, at its slowest
    rank's time. One small aggregate query, so the rebalancer can tell whether a window's worth has come in
    without reading and folding the steps."""
    r = job_reports.c
    per_step = (select(r.step, func.max(r.step_time_s).label("t")).where(r.job_id == job_id, r.step > after_step)
                .group_by(r.step).subquery())
    with engine.connect() as conn:
        n, seconds = conn.execute(select(func.count(), func.coalesce(func.sum(per_step.c.t), 0.0))).one()
    return int(n), float(seconds)


# A report's steps that every rank has reported, by the unique (job, step, rank) index; built once (the report path).
_COMPLETE = (select(job_reports.c.step).where(job_reports.c.job_id == bindparam("job_id"),
                                              job_reports.c.step.in_(bindparam("steps", expanding=True)))
             .group_by(job_reports.c.step).having(func.count() >= bindparam("ranks")).limit(1))


def completes_a_step(engine: Engine, job_id: int, steps: Sequence[int], ranks: int) -> bool:
    """Whether all ``ranks`` ranks have reported one of ``steps`` (what a report or a batch of reports just
    stored). A batch may complete a step below its newest: a rank's batch ends at its newest step, which the other
    ranks, posting their own batches a little earlier, have usually not reported yet."""
    with engine.connect() as conn:
        params = {"job_id": job_id, "steps": sorted(set(steps)), "ranks": ranks}
        return conn.execute(_COMPLETE, params).first() is not None


SCALE_COLUMNS = ("step", "rank", "received_ms", "step_time_s", "samples", "hostname", "local_gpu")


def newest_rank_rows(engine: Engine, job_id: int, limit: int) -> list[Report]:
    """The job's newest ``limit`` rank reports (newest first), with what says how many GPUs ran a step and how
    fast: a range read of the (job, received_ms) index, bounded whatever the job's age."""
    r = job_reports.c
    query = (select(*(r[c] for c in SCALE_COLUMNS)).where(r.job_id == job_id)
             .order_by(r.received_ms.desc(), r.step.desc(), r.rank).limit(max(0, int(limit))))
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(query).mappings()]

