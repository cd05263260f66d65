"""Training jobs in the store: registration (ranks, device map, knobs with bounds, mode, owner, roles), the step
reports each rank sends, and the host names whose data is simulated.

A job's knob changes and their per-rank acknowledgements are :mod:`trimtab.store.changes`; a registration or a
mode switch cancels there the pending changes it no longer allows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import Connection, Engine, bindparam, func, insert, select, update

from trimtab.contract.roles import RolePlacement, device_map_of
from trimtab.store.changes import cancel_disallowed
from trimtab.store.inserts import insert_ignoring
from trimtab.store.models import api_tokens, gpu_processes, gpus, job_reports, jobs, nodes
from trimtab.store.transactions import write_transaction
from trimtab.store.wall_clock import now_ms


class JobOwnedElsewhere(PermissionError):
    """A job token tried to re-register a job that another, still active, job token registered."""


@dataclass(frozen=True)
class StoredJob:
    id: int
    name: str
    ranks: int
    device_map: dict[str, list[int]]
    hostnames: list[str]
    knobs: dict[str, dict[str, float]]  # knob → {"value", "min", "max"}
    mode: str
    owner_token_id: Optional[int]  # the job token that registered it; None when an admin did
    created_ms: int
    updated_ms: int
    last_report_ms: Optional[int] = None
    rules: Optional[dict[str, Any]] = None  # the job's overrides of the rules file
    advise_only_reason: Optional[str] = None  # why the job declares no knobs (its framework cannot change them)
    roles: tuple[RolePlacement, ...] = ()  # where its roles run (found by the job's adapter, or declared)


REPORT_COLUMNS = tuple(c.name for c in job_reports.columns if c.name not in ("id", "job_id"))


def _job(row, last_report_ms: Optional[int] = None) -> StoredJob:
    return StoredJob(row.id, row.name, row.ranks, row.device_map, row.hostnames, row.knobs, row.mode,
                     row.owner_token_id, row.created_ms, row.updated_ms, last_report_ms, row.rules or None,
                     row.advise_only_reason, tuple(RolePlacement.from_wire(r) for r in row.roles or ()))


PROCESS_LOOKBACK_MS = 600_000  # verl's workers hold their GPUs (init_model) before fit starts and registers the job


def _with_process_gpus(conn: Connection, job: StoredJob) -> StoredJob:
    """Roles whose GPUs the job could not tell (GPU UUIDs in CUDA_VISIBLE_DEVICES, …) get them from NVML's process
    list on their node: the GPUs where the agent saw one of their pids since shortly before the job registered.
    An empty device map follows from them."""
    missing = [p for p in job.roles if not p.gpus and p.pids]
    if not missing:
        return job
    resolved = {}
    for p in missing:
        rows = conn.execute(
            select(gpus.c.gpu_index).distinct()
            .select_from(gpu_processes.join(gpus, gpus.c.id == gpu_processes.c.gpu_id)
                         .join(nodes, nodes.c.id == gpus.c.node_id))
            .where(nodes.c.hostname == p.node, gpu_processes.c.pid.in_(p.pids), gpus.c.gpu_index >= 0,
                   gpu_processes.c.ts_ms >= job.created_ms - PROCESS_LOOKBACK_MS))
        found = tuple(sorted(r.gpu_index for r in rows))
        if found:
            resolved[p] = replace(p, gpus=found, source="nvml")
    if not resolved:
        return job
    roles = tuple(resolved.get(p, p) for p in job.roles)
    return replace(job, roles=roles, device_map=job.device_map or device_map_of(roles))


def _last_report(job_id) -> Any:
    return (select(func.max(job_reports.c.received_ms)).where(job_reports.c.job_id == job_id)
            .scalar_subquery().label("last_report_ms"))


# The statements of the report path (each report reads its job, its newest step and its pending changes —
# trimtab.store.changes' _PENDING — and inserts one row: insert_ignoring), built once: a statement
# built per call costs SQLAlchemy its construction and cache key every time, which was most of a report's store
# time (issue 20, report latency). Parameters come at execution.
_JOB_BY_NAME = select(jobs, _last_report(jobs.c.id)).where(jobs.c.name == bindparam("name"))
_NEWEST_STEP = select(func.max(job_reports.c.step)).where(job_reports.c.job_id == bindparam("job_id"))


def get_job(engine: Engine, name: str) -> Optional[StoredJob]:
    with engine.connect() as conn:
        row = conn.execute(_JOB_BY_NAME, {"name": name}).first()
        return None if row is None else _with_process_gpus(conn, _job(row, row.last_report_ms))


def list_jobs(engine: Engine, limit: int, offset: int) -> list[StoredJob]:
    with engine.connect() as conn:
        rows = conn.execute(select(jobs, _last_report(jobs.c.id)).order_by(jobs.c.name).limit(limit).offset(offset))
        return [_with_process_gpus(conn, _job(r, r.last_report_ms)) for r in rows.all()]


def register_job(engine: Engine, name: str, ranks: int, device_map: Mapping[str, list[int]], hostnames: list[str],
                 knobs: Mapping[str, Mapping[str, float]], mode: str, token_id: Optional[int],
                 token_is_admin: bool, rules: Optional[Mapping[str, Any]] = None,
                 advise_only_reason: Optional[str] = None,
                 roles: Sequence[RolePlacement] = ()) -> tuple[StoredJob, bool]:
    """Create the job or update it (a restarted job registers again): (job, created). A job token owns the jobs
    it registers; another job token may take one over only once the owner is revoked. A job an admin token
    registered has no owner and stays the admins' (no job token may take it). Pending changes that the new
    declaration no longer allows are cancelled."""
    values = dict(ranks=ranks, device_map=dict(device_map), hostnames=list(hostnames),
                  knobs={k: dict(v) for k, v in knobs.items()}, mode=mode, rules=dict(rules) if rules else None,
                  advise_only_reason=advise_only_reason, updated_ms=now_ms(),
                  roles=[r.to_wire() for r in roles] or None)
    owner = None if token_is_admin else token_id
    with write_transaction(engine) as conn:
        row = conn.execute(select(jobs).where(jobs.c.name == name)).first()
        if row is None:
            job_id = conn.execute(insert(jobs).values(name=name, owner_token_id=owner, created_ms=values["updated_ms"],
                                                      **values).returning(jobs.c.id)).scalar_one()
            created = True
        else:
            job_id, created = row.id, False
            if not token_is_admin and row.owner_token_id is None:
                raise JobOwnedElsewhere(f"job {name!r} was registered with an admin token: only admin tokens may "
                                        f"write to it")
            if not token_is_admin and row.owner_token_id != token_id and _token_active(conn, row.owner_token_id):
                raise JobOwnedElsewhere(f"job {name!r} belongs to another job token")
            if not token_is_admin:
                values["owner_token_id"] = token_id
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
            cancel_disallowed(conn, job_id, values["knobs"], mode)
        row = conn.execute(select(jobs, _last_report(jobs.c.id)).where(jobs.c.id == job_id)).one()
        job = _with_process_gpus(conn, _job(row, row.last_report_ms))
    return job, created


def _token_active(conn: Connection, token_id: int) -> bool:
    revoked = conn.execute(select(api_tokens.c.revoked_ms).where(api_tokens.c.id == token_id)).first()
    return revoked is not None and revoked[0] is None


def set_mode(engine: Engine, name: str, mode: str) -> Optional[StoredJob]:
    """Switch how the rebalancer treats the job; ``off`` also cancels a change still pending."""
    with write_transaction(engine) as conn:
        row = conn.execute(select(jobs).where(jobs.c.name == name)).first()
        if row is None:
            return None
        conn.execute(update(jobs).where(jobs.c.id == row.id).values(mode=mode, updated_ms=now_ms()))
        cancel_disallowed(conn, row.id, row.knobs, mode)
    return get_job(engine, name)


# -- step reports --------------------------------------------------------------------------------------------


def add_report(engine: Engine, job_id: int, report: Mapping[str, Any]) -> bool:
    """Store one rank's step report; False when that (step, rank) was stored before (a resend)."""
    row = {name: report.get(name) for name in REPORT_COLUMNS}
    row["received_ms"] = now_ms()
    row["job_id"] = job_id
    with write_transaction(engine) as conn:  # a row back = inserted (rowcount is not portable here)
        return conn.execute(insert_ignoring(conn.dialect, job_reports, "id"), row).first() is not None


def add_reports(engine: Engine, job_id: int, reports: Sequence[Mapping[str, Any]]) -> int:
    """Store several step reports at once (:func:`added_reports`); how many of them were new."""
    return len(added_reports(engine, job_id, reports))


def added_reports(engine: Engine, job_id: int, reports: Sequence[Mapping[str, Any]]) -> list[int]:
    """Store step reports (of any ranks) in one write transaction and one statement — one commit and one turn at
    SQLite's write lock however many, where one POST per report paid each; the indices of those newly stored. A
    (step, rank) stored before (a resend) or twice in ``reports`` is stored once (its first copy), as by add_report."""
    received_ms = now_ms()
    rows = [{**{name: report.get(name) for name in REPORT_COLUMNS}, "received_ms": received_ms, "job_id": job_id}
            for report in reports]
    if not rows:
        return []
    with write_transaction(engine) as conn:  # the rows back are the ones inserted
        inserted = conn.execute(insert_ignoring(conn.dialect, job_reports, "step", "rank"), rows)
        new = {(r.step, r.rank) for r in inserted}
    first: dict[tuple[int, int], int] = {}
    for i, row in enumerate(rows):
        first.setdefault((row["step"], row["rank"]), i)
    return sorted(i for key, i in first.items() if key in new)


def newest_step(engine: Engine, job_id: int) -> Optional[int]:
    """The highest step any rank of the job has reported (None: no reports yet); one indexed lookup."""
    with engine.connect() as conn:
        return conn.execute(_NEWEST_STEP, {"job_id": job_id}).scalar_one()


def list_reports(engine: Engine, job_id: int, limit: int, offset: int) -> list[dict[str, Any]]:
    """Newest steps first, ranks in order; each report as a dict of its columns."""
    r = job_reports.c
    query = (select(*(r[n] for n in REPORT_COLUMNS)).where(r.job_id == job_id)
             .order_by(r.step.desc(), r.rank, r.id).limit(limit).offset(offset))
    with engine.connect() as conn:
        return [dict(m) for m in conn.execute(query).mappings()]


SIMULATED_SUFFIX = "-sim"  # a simulated node is stored as '<host>-sim' (trimtab.agent.sampler)


def simulated_hostnames(engine: Engine) -> set[str]:
    """Host names whose data is simulated: a job running on one says so in every response about it. That is every
    simulated node, and the plain host name of a '<host>-sim' node where <host> has no real node: a job reports
    under its machine's host name, and on such a machine its GPUs are the simulated node's."""
    with engine.connect() as conn:
        rows = conn.execute(select(nodes.c.hostname, nodes.c.simulated)).all()
    simulated = {h for h, sim in rows if sim}
    real = {h for h, sim in rows if not sim}
    bases = {h[: -len(SIMULATED_SUFFIX)] for h in simulated if h.endswith(SIMULATED_SUFFIX)}
    return simulated | (bases - real)


def only_simulated(engine: Engine, hostname: Optional[str] = None) -> bool:
    """Whether the store knows nodes (or the node ``hostname``) and every one of them is simulated."""
    query = select(nodes.c.simulated)
    if hostname is not None:
        query = query.where(nodes.c.hostname == hostname)
    with engine.connect() as conn:
        kinds = set(conn.execute(query).scalars())
    return kinds == {True}
