"""The balance verdict of every node (``trimtab check``'s data), graded over a recent window, and of every live job."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query

from trimtab.api.context import ApiContext
from trimtab.api.deps import READ, get_ctx
from trimtab.api.routes.gpus import node_query
from trimtab.api.balance_schemas import BalanceJobsOut, BalanceOut, BalanceReportOut, JobCheckOut
from trimtab.contract.statuses import SEVERITY
from trimtab.grading.job_report import live_job_summaries
from trimtab.grading.node_report import node_reports

router = APIRouter(prefix="/v1", tags=["telemetry"])

WINDOW_DOC = "Grade the means of the last window_s seconds."


@router.get("/balance", response_model=BalanceOut, responses=READ, summary="Balance verdict per node",
            description="For every node with samples in the last window_s seconds (or one node): per-GPU window "
                        "means and one verdict per GPU rule of the daemon's rules (shipped: utilization spread, PCIe % "
                        "of peak, memory), graded against the rule's thresholds (ok / watch / act). While no job "
                        "reports through the trainer hook the job-level checks appear here as no_data rows; once jobs report they are graded per job "
                        "(GET /v1/balance/jobs). The overall status is the worst; no_data when no node has samples "
                        "in the window; stale when a node's newest sample is older than a few of its sampling "
                        "intervals (its report's stale_after_s): its verdicts are then no current ones.")
def balance(window_s: float = Query(30.0, ge=1, le=90 * 86400, description=WINDOW_DOC),
            node: Optional[str] = node_query(), ctx: ApiContext = Depends(get_ctx)) -> BalanceOut:
    reports = node_reports(ctx.engine, window_s, hostname=node, rules=ctx.rules)
    status = max((r.status for r in reports), key=SEVERITY.__getitem__) if reports else "no_data"
    if any(r.stale for r in reports):
        status = "stale"
    return BalanceOut(status=status, simulated=any(r.simulated for r in reports), window_s=window_s,
                      reports=[BalanceReportOut.model_validate(r.to_dict()) for r in reports])


@router.get("/balance/jobs", response_model=BalanceJobsOut, responses=READ, summary="Balance verdict per job",
            description="For every job that sent a step report within window_s seconds (at least the last 10 "
                        "minutes; or only the jobs on one node): mode, knobs, throughput, and the rows step "
                        "composition, fragmentation and collective latency over the job's newest window of steps, "
                        "graded by the rules as the rebalancer sees them (ok / watch / act), with the job's recent "
                        "decisions. The overall status is the worst; no_data when no job reported.")
def balance_jobs(window_s: float = Query(30.0, ge=1, le=90 * 86400, description="List the jobs that reported "
                                                                                  "within max(window_s, 600) s."),
                 node: Optional[str] = node_query("Only jobs that run on this node (as they registered it)."),
                 ctx: ApiContext = Depends(get_ctx)) -> BalanceJobsOut:
    jobs = live_job_summaries(ctx.engine, window_s, ctx.rules, hostname=node)
    status = max((j.status for j in jobs), key=SEVERITY.__getitem__) if jobs else "no_data"
    return BalanceJobsOut(status=status, simulated=any(j.simulated for j in jobs), window_s=window_s,
                          jobs=[JobCheckOut.model_validate(j.to_dict()) for j in jobs])
