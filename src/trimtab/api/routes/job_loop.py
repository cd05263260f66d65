"""The loop between a job and the rebalancer: step reports in, pending knob changes out (in the report's
response), acknowledgements of the step each rank applied a change at, and manual changes by an admin."""

from __future__ import annotations

from typing import Optional, Sequence

from fastapi import APIRouter, Depends, HTTPException
from starlette.concurrency import run_in_threadpool

from trimtab.api.context import ApiContext
from trimtab.api.deps import (NOT_FOUND, READ, WRITE, Page, TokenCheck, get_ctx, page, require_scope,
                              scope_checked_by_route)
from trimtab.api.errors import invalid
from trimtab.api.job_schemas import (AckIn, AckOut, ChangeIn, ChangeOut, ChangesOut, PendingChangeOut,
                                     RefusalIn, ReportAcceptedOut, ReportBatchAcceptedOut, ReportBatchIn, ReportIn,
                                     ReportOut, ReportsOut)
from trimtab.api.routes.jobs import find_job, job_for_write, job_name_path
from trimtab.contract.step_report import MAX_REPORTS_PER_BATCH, to_columns, untime_if_ahead
from trimtab.store import changes as change_store
from trimtab.store import jobs as job_store
from trimtab.store.changes import StoredChange
from trimtab.store.jobs import StoredJob
from trimtab.store.tokens import StoredToken
from trimtab.store.wall_clock import now_ms

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _rank_of(ctx: ApiContext, name: str, token: StoredToken, rank: int) -> StoredJob:
    """The job a rank writes to, if ``token`` may write to it and the job has that rank."""
    return _with_rank(job_for_write(ctx, name, token), rank)


def _with_rank(job: StoredJob, rank: int, at: tuple = ("body",)) -> StoredJob:
    """``job``, if it has ``rank``; else a 422 naming the rank under ``at`` (a batch: its report's place in it)."""
    if rank >= job.ranks:
        raise invalid((*at, "rank"), f"rank {rank} out of range: job {job.name!r} has {job.ranks} ranks")
    return job


def change_out(change: StoredChange) -> ChangeOut:
    return ChangeOut(change_id=change.id, knob=change.knob, value=change.value, previous_value=change.previous_value,
                     reason=change.reason, source=change.source, status=change.status, created_ms=change.created_ms,
                     applied_step=change.applied_step, applied_ms=change.applied_ms,
                     acks=[AckOut(rank=a.rank, applied_at_step=a.applied_at_step, acked_ms=a.acked_ms)
                           for a in change.acks], refused_reason=change.refused_reason)


def _check_possible(ctx: ApiContext, job: StoredJob, body: ReportIn, newest: Optional[int],
                    at: tuple = ("body",)) -> None:
    """422 for a report that cannot describe a real step (and would fire rules on garbage): a step longer than
    the job has existed (since its first registration, give or take the clocks' skew: a 10⁷ s step), a phase far
    longer than the step (a prefetched phase overlaps a few steps, not a million), phases adding up far beyond it,
    or a step number far ahead of ``newest``, the job's newest step (it would stay "newest" in every later window).
    A step that is possible but far off the job's own is stored and left out of the rebalancer's windows
    (src/trimtab/grading/window.py). ``at``: where the report is in the body (a batch's: its index there), for
    the 422's location."""
    ctl = ctx.rules.controller
    age_s = max(0.0, (now_ms() - job.created_ms) / 1000.0)
    if body.step_time_s > age_s + ctl.report_clock_skew_s:
        raise invalid((*at, "step_time_s"), f"step_time_s {body.step_time_s:g} s is longer than the job has "
                                            f"existed ({age_s:.0f} s since its first registration, "
                                            f"+{ctl.report_clock_skew_s:g} s for clock skew)")
    phases = {k: v for k, v in body.phases.model_dump().items() if v is not None}
    gpu = {k: v for k, v in (body.gpu_phases.model_dump() if body.gpu_phases else {}).items() if v is not None}
    slack_s = ctl.report_phase_slack_s
    for group, timed in (("phases", phases), ("gpu_phases", gpu)):
        for phase, seconds in timed.items():
            if seconds > body.step_time_s * ctl.report_phase_max_x_step + slack_s:
                raise invalid((*at, group, phase), f"{phase} {seconds:g} s is more than "
                                                   f"{ctl.report_phase_max_x_step:g}× the step (step_time_s "
                                                   f"{body.step_time_s:g} s)")
    if sum(phases.values()) > body.step_time_s * ctl.report_phases_sum_max_x_step + slack_s:
        raise invalid((*at, "phases"), f"phases add up to {sum(phases.values()):g} s, more than "
                                       f"{ctl.report_phases_sum_max_x_step:g}× the step (step_time_s "
                                       f"{body.step_time_s:g} s)")
    if newest is not None and body.step > newest + ctl.report_max_steps_ahead:
        raise invalid((*at, "step"), f"step {body.step} is more than {ctl.report_max_steps_ahead} steps ahead "
                                     f"of the job's newest report (step {newest})")


@router.post("/{name}/reports", response_model=ReportAcceptedOut, responses={**WRITE, **NOT_FOUND},
             summary="Post a step report",
             description="One rank's report of one step: step time and its phases, samples, tokens, allocator "
                         "statistics, collective latency, when it ended (`ended_ms`: the step's time, also when "
                         "the report comes late; more than 300 s ahead of the server's clock, the report is filed "
                         "at its arrival and `untimed` says so). A resent (step, rank) is not stored twice. The "
                         "response "
                         "carries the job's pending knob changes: apply them at a step boundary on every rank, then "
                         "acknowledge. The report is answered from ingest alone; the rebalancer plans the job on its "
                         "own thread once the report is stored, so a change it decides arrives in the response to a "
                         "following report. Scope: job — the job token that registered the job, or "
                         "an admin; 403 for any other job token, and for every job token when an admin "
                         "registered the job.")
async def post_report(body: ReportIn, name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx),
                      check: TokenCheck = Depends(scope_checked_by_route("job"))) -> ReportAcceptedOut:
    # One hand-off to the thread pool per report: its store calls there, its response checked here, on the event
    # loop (a ``def`` route's response is checked on the pool too: a second hand-off, issue 39).
    return await run_in_threadpool(_store_report, body, name, ctx, check)


def _store_report(body: ReportIn, name: str, ctx: ApiContext, check: TokenCheck) -> ReportAcceptedOut:
    job = _rank_of(ctx, name, check(), body.rank)  # the token first, on the pool's thread
    _check_possible(ctx, job, body, job_store.newest_step(ctx.engine, job.id))
    report = body.model_dump()
    untimed = untime_if_ahead(report, now_ms())
    stored = job_store.add_report(ctx.engine, job.id, to_columns(report))
    if stored and ctx.after_report is not None:  # queues a plan (never runs one here)
        ctx.after_report(job, body.step, body.step_time_s, memory=report.get("memory"), rank=body.rank)
    return ReportAcceptedOut(stored=stored, untimed=untimed, pending_changes=_pending(ctx, job))


def _pending(ctx: ApiContext, job: StoredJob) -> list[PendingChangeOut]:
    """The job's pending knob changes, as every report's answer carries them (none in mode off)."""
    pending = [] if job.mode == "off" else change_store.pending_changes(ctx.engine, job.id)
    return [PendingChangeOut(change_id=c.id, knob=c.knob, value=c.value, reason=c.reason) for c in pending]


@router.post("/{name}/report-batches", response_model=ReportBatchAcceptedOut, responses={**WRITE, **NOT_FOUND},
             summary="Post several step reports at once",
             description=f"1 to {MAX_REPORTS_PER_BATCH} step reports in one request (more: 422 naming `reports`), "
                         "each what POST /v1/jobs/{name}/reports takes. The hook sends this when several of a "
                         "rank's reports are queued (steps shorter than a report's round trip, or a backlog after "
                         "an outage): one request instead of one per step. Each report is checked as a single one "
                         "is, in the batch's order (a step number against the job's newest report and the batch's "
                         "earlier ones). All or nothing: one invalid report refuses the whole batch with a 422 whose "
                         '`loc` names the first invalid report and its field (`["body", "reports", <index>, '
                         "<field>, …]`; the first that breaks the schema, else the first that fails a check against "
                         "the job), and nothing of the batch is stored. A valid batch is stored in one "
                         "transaction; a resent (step, rank) is not stored twice: `stored` counts the reports new "
                         "to the store, `received` all of them. The response carries the job's pending knob "
                         "changes, as a single report's does; the rebalancer plans on its own thread. 404 for an "
                         "unknown job. Scope: job — as for reports, only the job token that registered the job, or "
                         "an admin.")
async def post_report_batch(body: ReportBatchIn, name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx),
                            check: TokenCheck = Depends(scope_checked_by_route("job"))) -> ReportBatchAcceptedOut:
    return await run_in_threadpool(_store_report_batch, body, name, ctx, check)  # one hand-off, as for one report


def _store_report_batch(body: ReportBatchIn, name: str, ctx: ApiContext, check: TokenCheck) -> ReportBatchAcceptedOut:
    job = job_for_write(ctx, name, check())  # the token first, on the pool's thread (as for one report)
    newest = job_store.newest_step(ctx.engine, job.id)
    for i, report in enumerate(body.reports):  # every report before anything is stored: all or nothing
        _check_possible(ctx, _with_rank(job, report.rank, ("body", "reports", i)), report, newest,
                        ("body", "reports", i))
        newest = report.step if newest is None else max(newest, report.step)
    reports, received_ms = [r.model_dump() for r in body.reports], now_ms()
    untimed = sum(untime_if_ahead(r, received_ms) for r in reports)
    added = job_store.added_reports(ctx.engine, job.id, [to_columns(r) for r in reports])
    if added and ctx.after_report is not None:
        _after_batch(ctx, job, [body.reports[i] for i in added])
    return ReportBatchAcceptedOut(stored=len(added), received=len(body.reports), untimed=untimed,
                                  pending_changes=_pending(ctx, job))


def _after_batch(ctx: ApiContext, job: StoredJob, added: Sequence[ReportIn]) -> None:
    """One ``after_report`` per batch, with its newest new report: it only queues a plan (never runs one here),
    counting each of the batch's new steps toward the job's wait (``earlier``) and asking whether any of them
    completed its step, so one call decides what one per report would, with one store read at most."""
    by_step = sorted(added, key=lambda r: r.step)
    newest = by_step[-1]
    ctx.after_report(job, newest.step, newest.step_time_s, earlier=[(r.step, r.step_time_s) for r in by_step[:-1]],
                     memory=newest.model_dump().get("memory"), rank=newest.rank)


@router.get("/{name}/reports", response_model=ReportsOut, responses={**READ, **NOT_FOUND},
            summary="List a job's step reports",
            description="Step reports, newest step first (ranks in order), paginated. 404 for an unknown job.")
def list_reports(name: str = job_name_path(), pages: Page = Depends(page),
                 ctx: ApiContext = Depends(get_ctx)) -> ReportsOut:
    job = find_job(ctx, name)
    rows, next_offset = pages.cut(job_store.list_reports(ctx.engine, job.id, pages.fetch(), pages.offset))
    simulated_hosts = job_store.simulated_hostnames(ctx.engine)
    return ReportsOut(simulated=any(h in simulated_hosts for h in job.hostnames),
                      reports=[ReportOut(**r) for r in rows], next_offset=next_offset)


@router.post("/{name}/acks", response_model=ChangeOut, responses={**WRITE, **NOT_FOUND},
             summary="Acknowledge an applied knob change",
             description="Says that `rank` applied change `change_id` at step `applied_at_step`. The first ack marks "
                         "the change applied and moves the job's knob to the new value; every rank's ack is kept. "
                         "404 for an unknown job; 422 naming change_id when the job has no such change, naming "
                         "rank when the job has no such rank. Scope: job — as for reports, only the job token "
                         "that registered the job, or an admin.")
async def ack(body: AckIn, name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx),
              check: TokenCheck = Depends(scope_checked_by_route("job"))) -> ChangeOut:
    return await run_in_threadpool(_store_ack, body, name, ctx, check)  # one hand-off, as for reports


def _store_ack(body: AckIn, name: str, ctx: ApiContext, check: TokenCheck) -> ChangeOut:
    job = _rank_of(ctx, name, check(), body.rank)  # the token first, on the pool's thread (as for reports)
    change = change_store.ack_change(ctx.engine, job.id, body.change_id, body.rank, body.applied_at_step)
    return change_out(_known(change, name, body.change_id))


def _known(change: Optional[StoredChange], name: str, change_id: int) -> StoredChange:
    """The change an ack or refusal named; the job exists (404 would say it does not), so a change it never had
    is a 422 naming change_id."""
    if change is None:
        raise invalid(("body", "change_id"), f"job {name!r} has no change {change_id}")
    return change


@router.post("/{name}/refusals", response_model=ChangeOut, responses={**WRITE, **NOT_FOUND},
             summary="Refuse a knob change the job cannot apply",
             description="Says that the code owning the knob on `rank` (the job's loop or a framework adapter) could "
                         "not apply change `change_id`, and why. The change ends `refused`, the job's knob keeps its "
                         "value, and the rebalancer closes its decision as `refused` (never counted as kept) and does "
                         "not try that knob again for a while. A change already applied stays applied. 404 for an "
                         "unknown job; 422 naming change_id when the job has no such change. Scope: job — only the "
                         "job token that registered the job, or an admin.")
def refuse(body: RefusalIn, name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx),
           token: StoredToken = Depends(require_scope("job"))) -> ChangeOut:
    job = _rank_of(ctx, name, token, body.rank)
    change = _known(change_store.refuse_change(ctx.engine, job.id, body.change_id, body.rank, body.reason), name,
                    body.change_id)
    if ctx.after_refusal is not None:
        ctx.after_refusal(job)  # the rebalancer closes the decision at once (on its own thread), not at the next report
    return change_out(change)


@router.post("/{name}/changes", response_model=ChangeOut, status_code=201, responses={**WRITE, **NOT_FOUND},
             summary="Queue a manual knob change",
             description="Queues a change of one declared knob to a value within its bounds (422 otherwise); it "
                         "reaches the job in the response to its next step report. A change still pending is "
                         "superseded (one change per job in flight). 409 when the job's mode is off. Scope: admin.")
def queue_change(body: ChangeIn, name: str = job_name_path(), ctx: ApiContext = Depends(get_ctx),
                 _token=Depends(require_scope("admin"))) -> ChangeOut:
    job = find_job(ctx, name)
    bounds = job.knobs.get(body.knob)
    if bounds is None:
        known = ", ".join(sorted(job.knobs)) or "none"
        raise invalid(("body", "knob"), f"job {name!r} declared no knob {body.knob!r} (declared: {known})")
    if not bounds["min"] <= body.value <= bounds["max"]:
        raise invalid(("body", "value"), f"{body.knob} must stay within [{bounds['min']}, {bounds['max']}]")
    if all(isinstance(bounds[k], int) for k in ("value", "min", "max")) and not float(body.value).is_integer():
        raise invalid(("body", "value"), f"{body.knob} was declared with integers: a batch size or depth has no "
                                         f"fractional values")
    if job.mode == "off":
        raise HTTPException(409, f"job {name!r} is in mode off: no changes are delivered to it")
    return change_out(change_store.queue_change(ctx.engine, job.id, body.knob, body.value, body.reason, "manual"))


@router.get("/{name}/changes", response_model=ChangesOut, responses={**READ, **NOT_FOUND},
            summary="List a job's knob changes",
            description="Knob changes (manual and the rebalancer's), newest first, with their status and per-rank "
                        "acks; paginated. 404 for an unknown job.")
def list_changes(name: str = job_name_path(), pages: Page = Depends(page),
                 ctx: ApiContext = Depends(get_ctx)) -> ChangesOut:
    job = find_job(ctx, name)
    rows, next_offset = pages.cut(change_store.list_changes(ctx.engine, job.id, pages.fetch(), pages.offset))
    return ChangesOut(changes=[change_out(c) for c in rows], next_offset=next_offset)
