"""The rebalancer's decisions with their evidence and outcome, newest first."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query

from trimtab.api.context import ApiContext
from trimtab.api.deps import NOT_FOUND, READ, Page, get_ctx, page
from trimtab.api.job_schemas import DecisionOut, DecisionsOut
from trimtab.api.routes.jobs import find_job
from trimtab.api.schemas import SLUG
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
