"""The rebalancer's decisions with their evidence and outcome, newest first; which server plans."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from trimtab.api.context import ApiContext
from trimtab.api.deps import NOT_FOUND, READ, Page, get_ctx, page
from trimtab.api.job_schemas import DecisionOut, DecisionsOut
from trimtab.api.routes.jobs import find_job
from trimtab.api.schemas_base import SLUG
from trimtab.store import jobs as job_store
from trimtab.store.decisions import list_decisions

router = APIRouter(prefix="/v1", tags=["jobs"])


@router.get("/decisions", response_model=DecisionsOut, responses={**READ, **NOT_FOUND},
            summary="List rebalancer decisions",
            description="Every decision (rule, evidence, change made, step applied, throughput before and after, "
                        "outcome), newest first, of all jobs or one; paginated. 404 for an unknown job.")
def decisions(job: Optional[str] = Query(None, min_length=1, max_length=128, pattern=SLUG,
                                         description="Only this job's decisions."),
              pages: Page = Depends(page), ctx: ApiContext = Depends(get_ctx)) -> DecisionsOut:
    job_id = find_job(ctx, job).id if job is not None else None
    rows, next_offset = pages.cut(list_decisions(ctx.engine, job_id, pages.fetch(), pages.offset))
    simulated_hosts = job_store.simulated_hostnames(ctx.engine)
    jobs = [job_store.get_job(ctx.engine, name) for name in {d.job for d in rows}]
    simulated = any(h in simulated_hosts for j in jobs if j is not None for h in j.hostnames)
    return DecisionsOut(simulated=simulated, decisions=[DecisionOut(**vars(d)) for d in rows], next_offset=next_offset)


class PlannerOut(BaseModel):
    planning_server: Optional[str] = Field(description="The server that holds the planner's lease (host, address, "
                                                       "pid); null while none holds a live one.")
    epoch: int = Field(description="How many times the lease was taken (each takeover raises it).")
    since_ms: Optional[int] = Field(None, description="When the planning server took the lease, epoch ms.")
    expires_in_ms: Optional[int] = Field(None, description="How long the lease lasts unless renewed (every second).")
    this_server: Optional[str] = Field(description="The answering server's name in the lease (null: it does not "
                                                   "take part: no rebalancer).")
    this_server_plans: bool = Field(description="Whether the answering server plans.")
    error: Optional[str] = Field(None, description="Why the lease could not be read.")


@router.get("/planner", response_model=PlannerOut, responses=READ, summary="Which server plans",
            description="Several `trimtab server`s on one PostgreSQL serve ingest and reads together; exactly one "
                        "plans: the holder of the store's planner lease, renewed every second. Another takes over "
                        "within about 6 s of its death; a decision is written only under the lease.")
def planner(ctx: ApiContext = Depends(get_ctx)) -> PlannerOut:
    from trimtab.control.leadership import lease_status

    return PlannerOut(**(ctx.planner_status() if ctx.planner_status is not None else lease_status(ctx.engine)))
