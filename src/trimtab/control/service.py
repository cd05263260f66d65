"""The rebalancer inside `trimtab up` and `trimtab server`: loads each live job's state from the store, runs the
controller's plan and writes what it decided (a change with its pending decision, a verdict, a rollback, advice).

Plans run on the rebalancer's own thread, never on a report's: a report is answered from ingest alone (with the
changes already pending), so a slow plan cannot delay it (issue 20: a plan on the report's path made reports take
seconds and the hook time out). The report route only notes that the job is worth planning and queues it (each
job at most once however many reports come in meanwhile); the thread plans the queued jobs in turn, and a change
it decides reaches the job in the response to its next report. Every ``interval_s`` the thread also sweeps the
jobs for ones whose last report came in while they were being planned. A job whose plan raises is an error event
on the job (stored, served by its API, check, /healthz and /metrics) and is planned again after a backoff
(plan_errors.py); it never stops the thread or the other jobs' plans. ``stop`` ends the thread after the plan in
progress. The daemon runs each plan in a child process (``start(own_process=True)``, plan_process.py): a thread
shares the API's interpreter lock, which kept report p99 in seconds while 100 jobs planned. The thread rests between
plans: planning takes at most ``PLAN_SHARE`` of a core, here or there. A Rebalancer never started plans on the
caller's thread (tests).

Planning costs per window, not per step: each plan says how many more steps and seconds of step time must come in
before planning again can change anything (:class:`~trimtab.control.plan.Wait`), and until then a report
costs a few counter updates here — no store read. A new registration, an ack, a mode switch (anything that moves
the job's ``updated_ms``) queues a plan at the job's next report (or the next sweep), a refusal at once; a
restarted daemon plans at the first report.
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import Engine

from trimtab.control import plan_errors as errors
from trimtab.control.controller import JobState, Plan, plan
from trimtab.control.plan_errors import Backoff, PlanFailure, Stage, store_failure
from trimtab.control.memory_fit import others_of
from trimtab.grading.grading import LIVE_JOB_S, rules_for
from trimtab.control.placement_bridge import placement_for
from trimtab.control.leadership import Leadership
from trimtab.control.plan_process import PlanProcess, can_plan_apart
from trimtab.control.plan_queue import PlanQueue
from trimtab.control.plan_writes import RebalancerWrites, child_writes
from trimtab.control.plan import Cadence, period, steps_needed
from trimtab.control.waste_cite import with_waste
from trimtab.grading.rules import RuleSet, default_rules
from trimtab.grading.window import first_probes, load_steps, steps_since
from trimtab.store import changes as change_store
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store
from trimtab.store.jobs import StoredJob
from trimtab.store.steps import completes_a_step
from trimtab.store.wall_clock import now_ms

log = logging.getLogger("trimtab.control")
# The most of its time the planning thread spends planning (CPU time, its own or the planning process's); it rests
# for the remainder. A thread that plans without rest holds the API's interpreter lock (GIL) most of the time; a
# process that does takes a core of two, and the API's threads, the store's writer and the jobs share the other.
PLAN_SHARE = 0.5
# The interpreter's thread switch interval while the rebalancer runs (Python's default: 5 ms). A report's store
# calls each give the GIL up and wait for it back: up to one interval each while a plan holds it.
SWITCH_INTERVAL_S = 0.001


@dataclass
class RebalancerStats:
    evaluations: int = 0
    changes_queued: int = 0
    advised: int = 0
    kept: int = 0
    rolled_back: int = 0
    refused: int = 0
    errors: int = 0
    last_error: Optional[str] = None
    last_evaluation_ms: Optional[int] = None
    notes: dict[str, str] = field(default_factory=dict)  # job → what it is doing
    failing: dict[str, PlanFailure] = field(default_factory=dict)  # job → its last failure, while its plans fail


class Rebalancer:
    def __init__(self, engine: Engine, rules: Optional[RuleSet] = None, interval_s: float = 1.0,
                 plan_share: float = PLAN_SHARE, leadership: Optional[Leadership] = None):
        """``leadership``: a :class:`~trimtab.control.leadership.Leadership`; the rebalancer then plans only while
        its server holds the planner's lease, and writes each decision fenced by it (None: it always plans)."""
        if not 0.0 < plan_share <= 1.0:
            raise ValueError(f"plan_share must be in (0, 1], not {plan_share!r}")
        self.engine = engine
        self.plan_share = plan_share
        self.rules = rules or default_rules()
        self.interval_s = interval_s
        self.stats = RebalancerStats()
        self._locks: dict[str, threading.Lock] = {}
        # job → (last report, last update) at its last evaluation: the loop re-evaluates a job only when a report,
        # an ack, a mode switch or a registration came in since (else it would reread the same window every second)
        self._seen: dict[str, tuple] = {}
        self._cadence: dict[str, Cadence] = {}  # job → when it is next worth planning
        self._others: dict[tuple[str, int], float] = {}  # (job, rank) → memory others held at its last report
        self._queue = PlanQueue()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._apart: Optional[PlanProcess] = None  # the process the plans run in (None: this one)
        self._backoff = Backoff(self.stats.failing)  # the jobs whose plans fail: when each is planned again
        self._said: dict[str, tuple] = {}  # job → the (note, gate) last stored for it (stored again when they change)
        self.leadership = leadership
        self._term = 0  # the leadership term the cadences above were learnt in
        # What writes the decisions (store/decisions.py's functions): fenced by the lease where there is one.
        self.writes: Any = RebalancerWrites(leadership.fenced_writes() if leadership is not None else decision_store)

    # -- driving -------------------------------------------------------------------------------------------

    def start(self, own_process: bool = False) -> "Rebalancer":
        """Plan on a thread of its own; ``own_process``: each plan in a child process (plan_process.py) where
        the store allows it, so plans do not share the API's interpreter lock (the daemon's choice)."""
        if own_process and can_plan_apart(self.engine):
            self._apart = PlanProcess(self.engine, self.rules, writes=None if child_writes() else self.writes)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._run, name="trimtab-rebalancer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop planning: the plan in progress ends, the queued ones are dropped (a restart plans at the next one)."""
        self._stop.set()
        self._queue.wake(drop=True)
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._apart is not None:
            self._apart.close()
        if self.leadership is not None:  # after the last plan's writes: the lease is free for another server now
            self.leadership.stop()

    def _run(self) -> None:
        """The planning thread: the queued jobs in turn, and a sweep of every live job each ``interval_s``."""
        next_sweep = time.monotonic() + self.interval_s
        if self._apart is not None and self.leadership is not None:
            self._warm_up()
        while not self._stop.is_set():
            try:
                if not self._leads():  # another server plans: wait for the lease (reports queue nothing here)
                    self._queue.wake(drop=True)
                    self._stop.wait(min(self.interval_s, 1.0))
                    continue
                queued = self._queue.take(max(0.0, next_sweep - time.monotonic()))
                cpu_s = self._cpu_s()
                if queued is not None:
                    try:
                        if not self._stop.is_set():
                            self._plan_queued(*queued)
                    finally:
                        self._queue.done()
                if time.monotonic() >= next_sweep and not self._stop.is_set():
                    self.run_once()
                    next_sweep = time.monotonic() + self.interval_s
                self._stop.wait(self._rest_s(self._cpu_s() - cpu_s))
            except Exception as exc:  # noqa: BLE001 - a bug here must not end planning for every job
                self._failed("the planning thread", exc)

    def _warm_up(self) -> None:
        """Start the planning process now, not at the first plan: a server that takes the lease over plans at its
        first sweep instead of seconds later (spawning one took 2-5 s on a loaded 2-core machine)."""
        try:
            self._apart.pid()
        except Exception as exc:  # noqa: BLE001 - it is started again at the first plan
            self._failed("starting the planning process", exc)

    def _leads(self) -> bool:
        """Whether this rebalancer may plan now: always without a leadership, else while its server holds the lease.
        A new term forgets when each job is next worth planning: another server planned them meanwhile."""
        if self.leadership is None:
            return True
        if not self.leadership.leading:
            return False
        if self.leadership.term != self._term:
            self._term = self.leadership.term
            self._cadence.clear()
            self._seen.clear()
        return True

    def _rest_s(self, plan_cpu_s: float) -> float:  # planning takes at most plan_share of a core (and the GIL)
        return plan_cpu_s * (1.0 - self.plan_share) / self.plan_share

    def _cpu_s(self) -> float:  # this thread's CPU time and the planning process's
        return time.thread_time() + (self._apart.cpu_s if self._apart is not None else 0.0)

    def _plan_queued(self, job: StoredJob, forced: bool) -> None:
        if self._backing_off(job.name):  # queued before its plan failed: its retry comes after the backoff
            return
        if self._apart is not None:  # the child reads the store (for the check too), unless this one knows
            c = self._cadence.get(job.name)
            return self._apart.plan(self, job, check=not (forced or c is None or c.due))
        fresh = job_store.get_job(self.engine, job.name) or job
        # A plan that ran since the job was queued (the sweep's, or its own) may have covered it: its wait decides.
        if forced or self._worth_planning(fresh):
            self.evaluate(fresh, wait=True)

    def queued(self) -> list[str]:  # the jobs waiting for a plan, first first
        return self._queue.names()

    def wait_planned(self, timeout_s: float = 10.0) -> bool:  # until every queued plan ran (False: timed out)
        return self._queue.wait_empty(timeout_s)

    def _request_plan(self, job: StoredJob, forced: bool = False) -> None:
        """Plan ``job`` on the planning thread (on the caller's if the rebalancer was never started)."""
        if self._backing_off(job.name):
            return
        if self._thread is None:
            self.evaluate(job, wait=False)
        elif not self._stop.is_set() and (self.leadership is None or self.leadership.leading):
            self._queue.put(job, forced)

    def run_once(self) -> None:
        """Plan every job that reported recently (and is not off) and may have something new to plan: queued
        for the planning thread (which calls this every ``interval_s``), or at once if it was never started."""
        try:
            jobs = self._apart.jobs() if self._apart else job_store.list_jobs(self.engine, limit=10_000, offset=0)
        except Exception as exc:  # a dead store connection: next round
            self._failed("listing jobs", exc)
            return
        cutoff = now_ms() - LIVE_JOB_S * 1000
        queued = set(self.queued())
        for job in jobs:
            if job.mode != "off" and job.last_report_ms is not None and job.last_report_ms >= cutoff \
                    and job.name not in queued and self._seen.get(job.name) != _state_key(job) \
                    and not self._backing_off(job.name):
                if self._thread is None:
                    if self._worth_planning(job):
                        self.evaluate(job, wait=True)
                else:  # whether it is worth planning is asked when its turn comes, at the thread's pace: a
                    self._queue.put(job)  # hundred jobs' store queries in one burst would hold up the reports

    def _worth_planning(self, job: StoredJob) -> bool:
        """The job's last plan is over (due, or the job changed since), or the steps stored since cover its wait."""
        cadence = self._cadence.get(job.name)
        if cadence is None or cadence.due or cadence.updated_ms != job.updated_ms:
            return True
        steps, seconds = steps_since(self.engine, job.id, cadence.planned_step)
        return cadence.wait.over(steps, seconds)

    def after_report(self, job: StoredJob, step: int, step_time_s: Optional[float] = None,
                     earlier: Sequence[tuple[int, float]] = (), memory: Optional[Mapping[str, Any]] = None,
                     rank: int = 0) -> None:
        """Called by the report route once a report is stored (``step_time_s``: the report's), and once per batch
        by the batch route (``step``: its newest new report; ``earlier``: its other new ones, (step, step_time_s) in
        step order). Queues the job for a plan only when its last plan said a window's worth of new steps could
        change something (or the job changed since), and only at the report that completes a step (the last rank's:
        63 of 64 would reread the same window for nothing). Never plans on the caller's thread (unless the
        rebalancer was never started). Every step of a batch counts toward the wait, and any may complete a step."""
        if job.mode == "off":
            return
        if memory and self._neighbour_arrived(job, rank, memory):
            self._request_plan(job, forced=True)
            return
        cadence = self._cadence.get(job.name)
        if cadence is not None and cadence.updated_ms == job.updated_ms and step_time_s is not None \
                and not cadence.count([*earlier, (step, step_time_s)]):
            return
        if job.ranks > 1 and not completes_a_step(self.engine, job.id, [step, *(s for s, _ in earlier)], job.ranks):
            return
        self._request_plan(job)

    def _neighbour_arrived(self, job: StoredJob, rank: int, memory: Mapping[str, Any]) -> bool:
        """The memory another process holds on the rank's GPU (``memory_fit.others_of``) rose by more than the
        memory margin since the rank's last report: planned now, not a window later — the forecast cuts a batch
        that no longer fits beside it before the next OOM (a window of fast steps is up to 20 steps)."""
        held = others_of(memory)
        if held is None:
            return False
        before = self._others.get((job.name, rank))
        self._others[(job.name, rank)] = held
        margin = self.rules.controller.memory_margin_pct / 100.0 * float(memory["total_bytes"])
        return before is not None and held - before > margin

    def after_refusal(self, job: StoredJob) -> None:
        """Called by the refusal route: the refused change's decision is closed at the job's next plan, queued now."""
        if job.mode != "off":
            self._request_plan(job, forced=True)

    def _lock(self, name: str) -> threading.Lock:  # (dict.setdefault with a str key is atomic under the GIL)
        return self._locks.setdefault(name, threading.Lock())

    def evaluate(self, job: StoredJob, wait: bool = True) -> Optional[Plan]:
        lock = self._lock(job.name)
        if not lock.acquire(blocking=wait):
            return None
        try:
            if self._apart is not None:
                return self._apart.plan(self, job)
            result, failure = self.plan_job(job)
            self.after_plan(job.name, failure)
            return result
        except Exception as exc:  # noqa: BLE001 - the bookkeeping's own bug: counted, and the thread goes on
            self._failed(f"job {job.name!r}", exc)
            return None
        finally:
            lock.release()

    def plan_job(self, job: StoredJob) -> tuple[Optional[Plan], Optional[PlanFailure]]:
        """One plan of ``job`` here: (the plan, None), or (None, what failed) once the failure is stored as the
        job's error event (with when it is tried again: ``plan_retry_min_s`` doubling to ``plan_retry_max_s``)."""
        at = Stage()
        try:
            fresh = job_store.get_job(self.engine, job.name) or job
            self._seen[job.name] = _state_key(fresh)
            result = self._evaluate(fresh, at)
            self.stats.notes[job.name] = result.note
            at.stage = errors.RECORDING
            key = (result.note, result.gate)
            if self._said.get(job.name) != key:  # (a write per change of what it says, not per plan)
                self.writes.record_plan(self.engine, fresh.id, at.step, result.note,
                                        result.gate.to_dict() if result.gate is not None else None)
                self._said[job.name] = key
            return result, None
        except Exception as exc:  # noqa: BLE001 - a bug in one job's plan must not stop the others'
            failure = PlanFailure.of(exc, at)
            log.debug("rebalancer: job %r: plan failed", job.name, exc_info=True)
            self._seen.pop(job.name, None)  # the sweep retries it once its backoff is over
            self._said.pop(job.name, None)  # the next plan that succeeds says so in the store
            self.stats.errors += 1
            self.stats.last_error = f"job {job.name!r}: {failure.summary()}"[:300]
            return None, store_failure(self.engine, job, failure, self.rules.controller,
                                       self.stats.failing.get(job.name), self.writes)

    def after_plan(self, name: str, failure: Optional[PlanFailure]) -> None:
        """A plan of job ``name`` ended (``failure``: it raised): its backoff set or cleared (plan_errors.py)."""
        self._backoff.after_plan(name, failure)

    def _backing_off(self, name: str) -> bool:
        return self._backoff.waiting(name)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{what}: {type(exc).__name__}: {exc}"[:300]
        log.warning("rebalancer: %s failed: %s", what, exc, exc_info=log.isEnabledFor(logging.DEBUG))

    # -- one evaluation ------------------------------------------------------------------------------------

    def rules_for(self, job: StoredJob) -> RuleSet:
        # Validated at registration; if a rules file changed since, fall back to the daemon's rules, loudly.
        return rules_for(job, self.rules,
                         on_error=lambda exc: log.warning("rebalancer: %s; using the daemon's rules for this job", exc))

    def load_state(self, job: StoredJob, rules: RuleSet) -> JobState:
        from trimtab.store.queries import gpu_aggregates

        engine, gpu_indices = self.engine, sorted({i for ids in job.device_map.values() for i in ids})

        def gpus(start_ms: int, end_ms: int):
            return [g for host in job.hostnames or [None]
                    for g in gpu_aggregates(engine, start_ms, end_ms, hostname=host) if g.gpu_index in gpu_indices]

        probes = first_probes(engine, job.id, rules.controller.probe_baseline_steps)
        baseline = statistics.median(probes) if len(probes) >= rules.controller.probe_baseline_steps else None
        # As many steps as the windows can need (a fast job's 4 s are 800 steps), bounded by steps_read_max.
        return JobState(job=job, steps=load_steps(engine, job.id, job.ranks, limit=steps_needed(rules, period(job, rules))),
                        changes=change_store.list_changes(engine, job.id, limit=50, offset=0),
                        decisions=decision_store.list_decisions(engine, job.id, limit=200, offset=0),
                        gpus=gpus, probe_baseline_us=baseline, now_ms=now_ms(), has_gpus=bool(gpu_indices))

    def _evaluate(self, job: StoredJob, at: Optional[Stage] = None) -> Plan:
        at = at or Stage()
        rules = self.rules_for(job)
        result = self._plan_and_execute(job, rules, at)
        if result.close is not None and result.rollback_to is None:
            # A verdict that queued nothing: its window is the next decision's "before" window, so decide now: the
            # next change waits for the job's next report, not a window (a step sooner: 25 s at batch 4 on the H200).
            fresh = job_store.get_job(self.engine, job.name) or job
            follow = self._plan_and_execute(fresh, rules, at)
            result = follow if (follow.change or follow.advised or follow.advice_rule) else result
        return result

    def _plan_and_execute(self, job: StoredJob, rules: RuleSet, at: Stage) -> Plan:
        at.stage = errors.LOADING
        state = self.load_state(job, rules)
        at.stage, at.step = errors.PLANNING, state.steps[-1].step if state.steps else None
        result = plan(state, rules, placement=placement_for)
        at.stage = errors.WRITING
        self.stats.evaluations += 1
        self.stats.last_evaluation_ms = now_ms()
        stored_step = next((d.applied_step for d in state.decisions if d.id == result.measuring), None)
        self._execute(job, result, stored_applied_step=stored_step)
        newest = state.steps[-1].step if state.steps else -1
        self._cadence[job.name] = Cadence(job.updated_ms, newest, result.wait)
        return result

    def _execute(self, job: StoredJob, p: Plan, stored_applied_step: Optional[int] = None) -> None:
        engine = self.engine
        if p.close is not None:
            rollback = None
            if p.outcome == "rolled_back" and p.rollback_to is not None and p.rollback_knob is not None:
                rollback = (job.id, p.rollback_knob, p.rollback_to, f"rollback: {p.note}")
            fields: dict[str, Any] = {"throughput_after_samples_per_s": p.throughput_after}
            if p.applied_step is not None:
                fields["applied_step"] = p.applied_step
            self.writes.close_decision(engine, p.close, p.outcome or "kept", p.evidence, rollback=rollback,
                                       **fields)
            if p.outcome in ("rolled_back", "refused", "kept"):
                setattr(self.stats, p.outcome, getattr(self.stats, p.outcome) + 1)
            log.info("rebalancer: job %s: %s", job.name, p.note)
        elif p.measuring is not None and p.applied_step is not None and p.applied_step != stored_applied_step:
            # (once: every plan while measuring would rewrite it, and SQLite has one writer for reports too)
            self.writes.set_applied_step(engine, p.measuring, p.applied_step)
        decided = p.change or p.advised
        evidence = p.evidence if decided is None and p.advice_rule is None else \
            with_waste(engine, job, p.evidence, decided.knob if decided else None, now_ms())  # the ledger's waste
        if p.change is not None:
            c = p.change
            _, queued = self.writes.decide_change(engine, job.id, c.rule, evidence, c.knob, c.new_value,
                                                  c.reason, throughput_before_samples_per_s=p.throughput_before,
                                                  advice=p.advice)
            counter = "changes_queued" if queued is not None else "advised"  # None: the job left auto meanwhile
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
            log.info("rebalancer: job %s%s: %s", job.name, "" if queued else " (left auto: advised)", p.note)
        elif p.advised is not None:
            c = p.advised
            self.writes.add_decision(engine, job.id, c.rule, evidence, knob=c.knob, old_value=c.old_value,
                                     new_value=c.new_value, throughput_before_samples_per_s=p.throughput_before,
                                     outcome="advised", advice=f"{c.reason}. {p.advice or ''}".strip())
            self.stats.advised += 1
            log.info("rebalancer: job %s (advise): %s", job.name, p.note)
        elif p.advice_rule is not None:
            self.writes.add_decision(engine, job.id, p.advice_rule, evidence, outcome="advised", advice=p.advice,
                                     throughput_before_samples_per_s=p.throughput_before)
            self.stats.advised += 1
            log.info("rebalancer: job %s: %s", job.name, p.note)

    # -- status ----------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        s = self.stats
        alive = self._thread is not None and self._thread.is_alive()
        return {"state": "running" if alive else "stopped", "rules": len(self.rules.rules),
                **{k: getattr(s, k) for k in ("evaluations", "changes_queued", "kept", "rolled_back", "refused",
                                              "advised", "errors", "last_error", "last_evaluation_ms")},
                "queued": len(self.queued()), "jobs": dict(s.notes),
                "failing": {name: {"failures": f.failures, "error": f.summary(), "retry_in_s": f.retry_in_s}
                            for name, f in sorted(s.failing.items())},
                **({"planner": self.leadership.status()} if self.leadership is not None else {})}

    def status_line(self) -> str:
        s = self.stats
        return (f"rebalancer: {len(s.notes)} jobs, {s.changes_queued} changes ({s.kept} kept, {s.rolled_back} "
                f"rolled back, {s.refused} refused), {s.advised} advised" + (f", {s.errors} errors" if s.errors else "")
                + (f", planning fails on {', '.join(sorted(s.failing))}" if s.failing else ""))


def _state_key(job: StoredJob) -> tuple:
    return (job.last_report_ms, job.updated_ms)
