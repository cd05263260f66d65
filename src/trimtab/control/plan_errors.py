"""A job whose plan raises: what failed (the exception, the stage of the plan, the job's step, where in trimtab's
code), as its error event is stored and served, and when it is planned again (exponential backoff per job).

Why: a plan that raised was a WARNING in the planning process's log, four times a second (every report queued the
job again), and nothing else — the job stayed unplanned in silence, its change in flight never judged (issue 38:
``ZeroDivisionError`` for 87 plans in a row). Now it is an event on the job (``store/plan_status.py``), visible in
``GET /v1/jobs/{name}``, ``trimtab check``, ``/healthz`` (degraded) and ``/metrics``; retried after 1 s, 2 s, 4 s … up
to ``plan_retry_max_s``; logged once per change of the backoff; other jobs are planned as before.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from sqlalchemy import Engine

import trimtab
from trimtab.grading.rules import ControllerSettings
from trimtab.store import plan_status
from trimtab.store.jobs import StoredJob

log = logging.getLogger("trimtab.control")

_ROOT = os.path.dirname(os.path.abspath(trimtab.__file__))

READING = "reading the job"
LOADING = "loading its steps, changes and decisions"
PLANNING = "planning"
WRITING = "writing what the plan decided"
RECORDING = "recording the plan's status"
CHILD_DIED = "the planning process died"


@dataclass
class Stage:
    """Where a plan is (``stage``) and the newest step it read (``step``), for the error of a plan that raises."""
    stage: str = READING
    step: Optional[int] = None


@dataclass(frozen=True)
class PlanFailure:
    type: str                       # the exception's class name
    message: str
    stage: str                      # one of the stages above
    step: Optional[int]             # the newest step of the job the plan read
    where: Optional[str]            # the innermost line of trimtab's code it raised in (path:line in function)
    failures: int = 1               # failures in a row, this one included (the store's count)
    retry_in_s: float = 0.0         # when it is planned again

    @classmethod
    def of(cls, exc: BaseException, at: Stage) -> "PlanFailure":
        return cls(type(exc).__name__, str(exc)[:500], at.stage, at.step, _where(exc))

    def error(self) -> dict[str, Any]:
        """What the store keeps of it (its counts are the store's own)."""
        return {k: v for k, v in asdict(self).items() if k not in ("failures", "retry_in_s")}

    def what(self) -> tuple[str, str, str]:
        """The failure without its step: the same error at the next step is the same error."""
        return self.type, self.message, self.stage

    def summary(self) -> str:
        return plan_status.describe(self.error())


def _where(exc: BaseException) -> Optional[str]:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(_ROOT + os.sep)]
    if not frames:
        return None
    f = frames[-1]
    return f"{os.path.relpath(f.filename, _ROOT)}:{f.lineno} in {f.name}" + (f": {f.line.strip()[:160]}"
                                                                             if f.line else "")


def store_failure(engine: Engine, job: StoredJob, failure: PlanFailure, ctl: ControllerSettings,
                  known: Optional[PlanFailure], writes: Any = plan_status) -> PlanFailure:
    """``failure`` stored as the job's error event, with the store's count of failures in a row and its backoff
    (they outlive a restart); a store that cannot take it: counted on from ``known``, the job's last failure.
    ``writes``: what makes the write (the rebalancer's: in the planning process, the parent makes it,
    plan_writes.py)."""
    try:
        failures, delay_s = writes.record_failure(engine, job.id, failure.error(), ctl.plan_retry_min_s,
                                                       ctl.plan_retry_max_s)
    except Exception as exc:  # noqa: BLE001 - the store is down: the backoff goes on in memory
        log.debug("rebalancer: job %r: storing its plan failure failed: %s", job.name, exc)
        failures = (known.failures if known is not None else 0) + 1
        delay_s = plan_status.retry_delay_s(failures, ctl.plan_retry_min_s, ctl.plan_retry_max_s)
    return replace(failure, failures=failures, retry_in_s=delay_s)


class Backoff:
    """The jobs whose plans fail, for the rebalancer that schedules plans: when each is planned again, and one log
    line per change of its backoff or its error (not one per failure), one at recovery. ``failing``: job → its last
    failure (the rebalancer's stats, shown on /healthz)."""

    def __init__(self, failing: dict[str, PlanFailure]):
        self.failing = failing
        self._retry_at: dict[str, float] = {}  # job → when (monotonic) it is planned again

    def after_plan(self, name: str, failure: Optional[PlanFailure]) -> None:
        known = self.failing.get(name)
        if failure is None:
            if known is not None:
                del self.failing[name]
                self._retry_at.pop(name, None)
                log.warning("rebalancer: job %r: planning recovered after %d failures", name, known.failures)
            return
        self.failing[name] = failure
        self._retry_at[name] = time.monotonic() + failure.retry_in_s
        if known is None or known.retry_in_s != failure.retry_in_s or known.what() != failure.what():
            log.warning("rebalancer: job %r: planning failed (%d in a row): %s; planned again in %g s", name,
                        failure.failures, failure.summary(), failure.retry_in_s)

    def waiting(self, name: str) -> bool:
        """The job's plans fail and its backoff is not over."""
        at = self._retry_at.get(name)
        return at is not None and time.monotonic() < at
