"""Jobs: registration by the trainer hook (idempotent per name), listing, and the admin's mode switch.

A ``job`` token owns the jobs it registers: it alone (or an admin) may report to them, acknowledge their
changes or re-register them, until it is revoked and another job token registers the job again. A job an
``admin`` token registered has no owner and belongs to the admins: no job token may report to it, acknowledge
its changes or re-register it (403), so an admin's job cannot be taken over by whoever holds a job token.
"""

from __future__ import annotations

import time
from typing import Optional

from fastapi import APIRouter, Depends, HTTPException, Path, Response

from trimtab.api.context import ApiContext
from trimtab.api.end_state_schemas import EndStateOut
from trimtab.api.deps import NOT_FOUND, READ, WRITE, Page, get_ctx, page, require_scope
from trimtab.api.job_schemas import JobIn, JobOut, JobsOut, ModeIn, RoleOut
from trimtab.api.planner_schemas import PlannerOut, planner_out
from trimtab.api.errors import invalid
from trimtab.api.schemas_base import SLUG
from trimtab.contract.roles import RolePlacement, device_map_of, gpus_by_role, merge
from trimtab.grading.end_state import job_end_state
from trimtab.grading.job_report import job_summaries
from trimtab.grading.rules import check_job_overrides
from trimtab.grading.rules_parse import RulesError
from trimtab.store import jobs as job_store
from trimtab.store import plan_status
from trimtab.store.jobs import StoredJob
from trimtab.store.tokens import StoredToken

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def job_name_path() -> str:
    return Path(min_length=1, max_length=128, pattern=SLUG, description="The job's name.")


def job_out(job: StoredJob, simulated_hosts: set[str], planner: Optional[PlannerOut] = None) -> JobOut:
    return JobOut(name=job.name, ranks=job.ranks, device_map=job.device_map, hostnames=job.hostnames,
                  roles=[RoleOut(**p.to_wire()) for p in job.roles],
                  gpus_by_role=gpus_by_role(job.roles, job.device_map, job.hostnames),
                  knobs=job.knobs, mode=job.mode, rules=job.rules,
                  advise_only_reason=job.advise_only_reason, simulated=any(h in simulated_hosts for h in job.hostnames),
                  created_ms=job.created_ms, updated_ms=job.updated_ms, last_report_ms=job.last_report_ms,
                  planner=planner)


def find_job(ctx: ApiContext, name: str) -> StoredJob:
    job = job_store.get_job(ctx.engine, name)
    if job is None:
        raise HTTPException(404, f"no job named {name!r}")
    return job


def job_for_write(ctx: ApiContext, name: str, token: StoredToken) -> StoredJob:
    """The job, if ``token`` may write to it: an admin, or the job token that registered it (a job an admin
    registered has no owner: admins only)."""
    job = find_job(ctx, name)
    if token.scope != "admin" and job.owner_token_id != token.id:
        whose = "an admin token: only admin tokens" if job.owner_token_id is None else "another job token: only it"
        raise HTTPException(403, f"job {name!r} was registered with {whose} may write to it")
    return job


@router.post("", response_model=JobOut, status_code=200, summary="Register (or re-register) a job",
             responses={**WRITE, 201: {"model": JobOut, "description": "Registered for the first time."}},
             description="Declares a job: ranks, device_map (component → local GPU indices), hostnames, roles "
                         "(role → node, GPUs and worker pids, as the job found them; an empty device_map is derived "
                         "from them), knobs with "
                         "bounds (min ≤ value ≤ max) and mode. Idempotent per name: registering again (a restarted "
                         "job) updates the declaration and answers 200; the first registration answers 201. Pending "
                         "changes the new bounds no longer allow are cancelled. Optional per-job rule overrides "
                         "(\"rules\") are checked against the daemon's rules file. Scope: job. Ownership: the "
                         "job token that registers a job owns it (only it, or an admin, may report to it, ack its "
                         "changes or register it again; another job token may take it over once the owner is "
                         "revoked); a job registered with an admin token has no owner and only admin tokens may "
                         "write to it (403 for any job token).")
def register(body: JobIn, response: Response, ctx: ApiContext = Depends(get_ctx),
             token: StoredToken = Depends(require_scope("job"))) -> JobOut:
    if body.rules:
        try:
            check_job_overrides(ctx.rules, body.rules)
        except RulesError as exc:
            raise invalid(("body", "rules"), str(exc)) from None
    roles = merge(RolePlacement(r.role, r.node, tuple(r.gpus), tuple(r.pids), r.source) for r in body.roles)
    try:
        job, created = job_store.register_job(
            ctx.engine, body.name, body.ranks, body.device_map or device_map_of(roles), body.hostnames,
            {k: v.model_dump() for k, v in body.knobs.items()}, body.mode, token.id, token.scope == "admin",
            rules=body.rules, advise_only_reason=body.advise_only_reason, roles=roles)
    except job_store.JobOwnedElsewhere as exc:
        raise HTTPException(403, str(exc)) from None
    if created:
        response.status_code = 201
    return job_out(job, job_store.simulated_hostnames(ctx.engine))


@router.get("", response_model=JobsOut, responses=READ, summary="List jobs",
            description="Registered jobs by name, with their knobs' current values and bounds and what the "
                        "rebalancer last said about each (planner: its note, the gate that held it, whether its plans "
                        "fail); paginated.")
def list_jobs(pages: Page = Depends(page), ctx: ApiContext = Depends(get_ctx)) -> JobsOut:
    rows, next_offset = pages.cut(job_store.list_jobs(ctx.engine, pages.fetch(), pages.offset))
    simulated_hosts = job_store.simulated_hostnames(ctx.engine)
    statuses = plan_status.plan_statuses(ctx.engine, [j.id for j in rows])
    out = [job_out(j, simulated_hosts, planner_out(statuses.get(j.id))) for j in rows]
    return JobsOut(simulated=any(j.simulated for j in out), jobs=out, next_offset=next_offset)


@router.get("/{name}", response_model=JobOut, responses={**READ, **NOT_FOUND}, summary="Get a job",
            description="One job's declaration (with its GPUs by role), knob values, when it last reported, and "
                        "what the rebalancer last said about it (planner): its last plan's note; when it decided "
                        "nothing, the gate that held it (collecting steps, measuring, settling, not measurable, bound "
                        "reached, memory headroom, a hold, advised recently, …), the window it read, the data it "
                        "misses and the step at which it expects to decide; while its plans raise, the error (type, "
                        "message, stage, step, where), failures in a row and since when, when it is tried again; its "
                        "recent planning events. And its end state (end_state): each GPU's mean utilization against "
                        "the band (60–75 % shipped), the step time's coefficient of variation (goal < 5 %) and the "
                        "scaling efficiency against the job's own steps at another GPU count in the store (unknown "
                        "without them), with the word: at end state, not yet (which part misses) or unknown. The "
                        "thresholds are rules.toml's end_state_* keys. 404 for an unknown job.")
def get_job(name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx)) -> JobOut:
    job = find_job(ctx, name)
    status = plan_status.plan_statuses(ctx.engine, [job.id]).get(job.id)
    out = job_out(job, job_store.simulated_hostnames(ctx.engine),
                  planner_out(status, plan_status.events(ctx.engine, job.id, limit=5) if status else []))
    out.end_state = EndStateOut(**job_end_state(ctx.engine, job, ctx.rules, int(time.time() * 1000)).to_dict())
    # graded as check grades it: the same window, the same words
    out.learning_advice = job_summaries(ctx.engine, [job], ctx.rules, decisions=0, planner=False)[0].learning_advice
    return out


@router.put("/{name}/mode", response_model=JobOut, responses={**WRITE, **NOT_FOUND}, summary="Set a job's mode",
            description="auto: the rebalancer applies changes; advise: it records decisions only; off: nothing is "
                        "delivered to the job (a pending change is cancelled). Scope: admin.")
def set_mode(body: ModeIn, name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx),
             _token=Depends(require_scope("admin"))) -> JobOut:
    job = job_store.set_mode(ctx.engine, name, body.mode)
    if job is None:
        raise HTTPException(404, f"no job named {name!r}")
    return job_out(job, job_store.simulated_hostnames(ctx.engine))
