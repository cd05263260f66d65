"""What the rebalancer last said about a job, as ``GET /v1/jobs/{name}`` serves it: its last plan's note, the gate
that held it when nothing was decided (control/gates.py), and whether planning the job fails (store/plan_status.py)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from trimtab.api.schemas_base import Model
from trimtab.control.gates import GATES
from trimtab.store.plan_status import JobEvent, PlanStatus


class GateOut(Model):
    name: str = Field(description="The gate that held the job: " + ", ".join(GATES) + ". collecting_steps: not a "
                                  "window's worth of steps since the last change; measuring: the change in flight is "
                                  "measured; settling: the before window's throughput still trends; not_measurable: "
                                  "the window has no throughput (no samples, lost steps); bound_reached, "
                                  "memory_headroom, hold: the rule fires and no action is left; advised_recently: "
                                  "advise mode, given within advice_repeat_s; safety_blocks: a safety rule blocks the "
                                  "rules after it; no_rule_fires: nothing to decide.")
    rule: Optional[str] = Field(None, description="The rule it held (null: none involved).")
    why: Optional[str] = Field(None, description="The skipped actions and why, the trend, the plan in flight.")
    window: Optional[dict[str, Any]] = Field(None, description="The window it read: steps [first, last], n_steps, "
                                                               "seconds, samples_per_s.")
    missing: Optional[str] = Field(None, description="The data it waits for (null: none).")
    expects_step: Optional[int] = Field(None, description="The step at which it expects to decide, at the pace of "
                                                          "the newest steps; null: not before the job moves (its "
                                                          "signal, knobs or throughput).")


class PlanErrorOut(Model):
    type: str = Field(description="The exception's class (ZeroDivisionError, …).")
    message: str = Field(description="Its message.")
    stage: str = Field(description="What the plan was doing: reading the job, loading its steps, planning, writing "
                                   "what it decided, recording its status, or the planning process died.")
    step: Optional[int] = Field(None, description="The newest step of the job the plan had read.")
    where: Optional[str] = Field(None, description="The innermost line of trimtab's code it raised in.")
    at_ms: int = Field(description="When, epoch milliseconds.")


class JobEventOut(Model):
    ts_ms: int = Field(description="When, epoch milliseconds.")
    kind: str = Field(description="planning_failed (a new error, or the first of a run of failures) or "
                                  "planning_recovered.")
    detail: dict[str, Any] = Field(description="The error (type, message, stage, step, where, failures, retry_in_s), "
                                               "or after_failures and the last error at recovery.")


class PlannerOut(Model):
    planned_ms: Optional[int] = Field(None, description="When its last plan ran to its end (null: none did yet).")
    step: Optional[int] = Field(None, description="The newest step that plan read.")
    note: Optional[str] = Field(None, description="What the plan said (the log's line).")
    gate: Optional[GateOut] = Field(None, description="Why it decided nothing; null when it decided something.")
    failing: bool = Field(description="True while the job's plans raise: the rebalancer retries it with backoff.")
    failing_since_ms: Optional[int] = Field(None, description="The first failure of the current run of failures.")
    failures: int = Field(description="Failures in a row (0 once a plan succeeds).")
    errors_total: int = Field(description="Failed plans of this job, ever (/metrics: trimtab_plan_errors_total).")
    last_error: Optional[PlanErrorOut] = Field(None, description="The last failure (kept after recovery).")
    retry_at_ms: Optional[int] = Field(None, description="While failing: when the job is planned again.")
    events: list[JobEventOut] = Field(default_factory=list, description="The job's recent planning events, newest "
                                                                         "first (GET /v1/jobs/{name} only).")


def planner_out(status: Optional[PlanStatus], events: list[JobEvent] = ()) -> Optional[PlannerOut]:
    if status is None:
        return None
    return PlannerOut(planned_ms=status.planned_ms, step=status.step, note=status.note,
                      gate=GateOut(**status.gate) if status.gate else None, failing=status.failing,
                      failing_since_ms=status.failing_since_ms, failures=status.failures,
                      errors_total=status.errors_total,
                      last_error=PlanErrorOut(**status.last_error) if status.last_error else None,
                      retry_at_ms=status.retry_at_ms,
                      events=[JobEventOut(ts_ms=e.ts_ms, kind=e.kind, detail=e.detail) for e in events])
