"""What the controller reads (:class:`JobState`) and returns (:class:`Plan`), and the window arithmetic its parts
share: steps per sync period, the leading steps of a measurement, a window's evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from trimtab.contract.statuses import APPLIED
from trimtab.control.cadence import with_cadence
from trimtab.control.gates import Gate
from trimtab.control.persistence import NONE as NO_PERSISTENCE, Persistence
from trimtab.grading.balance import GpuWindow
from trimtab.grading.rules import RuleSet
from trimtab.grading.signals import Reading
from trimtab.grading.window import JobStep, as_period, throughput
from trimtab.store.changes import StoredChange
from trimtab.store.decisions import StoredDecision
from trimtab.store.jobs import StoredJob

GpuFetch = Callable[[int, int], Sequence[GpuWindow]]  # (start_ms, end_ms) → the job's GPUs' window aggregates


@dataclass(frozen=True)
class JobState:
    job: StoredJob
    steps: Sequence[JobStep]                 # complete steps, oldest first
    changes: Sequence[StoredChange]          # newest first
    decisions: Sequence[StoredDecision]      # newest first (recent ones suffice)
    gpus: GpuFetch
    probe_baseline_us: Optional[float]
    now_ms: int
    has_gpus: bool                           # the job declared GPUs (a CPU job has no GPU memory to protect)
    persistence: Persistence = NO_PERSISTENCE  # how its periods persist at unchanged knobs (control/persistence.py)


@dataclass
class NewChange:
    rule: str
    knob: str
    old_value: float
    new_value: float
    reason: str


@dataclass(frozen=True)
class Wait:
    """Nothing this plan waits for can happen before the job has reported ``steps`` more complete steps holding
    ``seconds`` more step time (lower bounds), unless its registration, knobs or mode change first: the daemon
    plans again only then — once per window, not on every step. ``enough_steps``: or once this many steps are in,
    whatever their seconds (a window of fast steps is complete at ``window_enough_steps``)."""
    steps: int = 1
    seconds: float = 0.0
    enough_steps: Optional[int] = None

    def over(self, steps: int, seconds: float) -> bool:
        """Whether ``steps`` new steps holding ``seconds`` of step time end this wait (a small tolerance: step times
        summed in another order must not miss the window by a rounding error)."""
        return steps >= self.steps and (seconds >= self.seconds - 1e-6
                                        or (self.enough_steps is not None and steps >= self.enough_steps))


@dataclass
class Cadence:
    """When a job is next worth planning: ``wait`` more complete steps and step seconds after ``planned_step``
    (the rebalancer keeps one per job and counts the reports against it in memory, reading nothing)."""
    updated_ms: int                 # the job's registration/knobs/mode version the plan saw
    planned_step: int               # the newest step the plan saw
    wait: Wait
    newest_step: int = -1           # the newest step reported since
    steps: int = 0                  # new steps reported since (each counted at its first report)
    seconds: float = 0.0            # their step time (the first report's: a lower bound of the step's)
    due: bool = False               # the wait is over (the step that ends it may still miss a rank)

    def count(self, reports: Sequence[tuple[int, Optional[float]]]) -> bool:
        """Counts new reports, (step, step_time_s) in step order (one, or a batch's); whether the wait is over."""
        for step, step_time_s in reports:
            if step > max(self.newest_step, self.planned_step):
                self.newest_step = step
                self.steps += 1
                self.seconds += step_time_s or 0.0
        self.due = self.due or self.wait.over(self.steps, self.seconds)
        return self.due


@dataclass
class Plan:
    """What to do; at most one of ``change`` / ``advice_rule`` / ``close`` is set."""
    note: str                                          # why, for logs and /healthz
    change: Optional[NewChange] = None                 # queue it (auto) with a pending decision
    advised: Optional[NewChange] = None                # advise mode: the change it would make
    advice_rule: Optional[str] = None                  # record an advice-only decision for this rule
    advice: Optional[str] = None
    evidence: dict[str, Any] = field(default_factory=dict)
    throughput_before: Optional[float] = None
    close: Optional[int] = None                        # decision id to close …
    outcome: Optional[str] = None                      # … with this outcome
    throughput_after: Optional[float] = None
    rollback_to: Optional[float] = None                # queue the knob back to this value
    rollback_knob: Optional[str] = None
    applied_step: Optional[int] = None                 # the change's step, for the decision row
    measuring: Optional[int] = None                    # decision id being measured (its step is known now)
    readings: list[Reading] = field(default_factory=list)
    wait: Wait = field(default_factory=Wait)           # when planning again can change anything
    gate: Optional[Gate] = None                        # why nothing was decided (gates.py), for the job's API and check


def period(job: StoredJob, rules: RuleSet, steps: Sequence[JobStep] = ()) -> int:
    """Steps per sync period (the period knob's value; 1 when the job has no such knob), stretched to whole
    generation periods where ``steps`` show generation every k steps (``cadence.py``)."""
    spec = job.knobs.get(rules.controller.period_knob)
    return with_cadence(as_period(spec.get("value")) if isinstance(spec, dict) else 1, steps)


def longest_period(state: JobState, rules: RuleSet) -> int:
    """The longest sync interval the job's loaded steps may have run at: now, or before or after a change of it."""
    knob = rules.controller.period_knob
    values = [c.value for c in state.changes if c.knob == knob] + \
        [c.previous_value for c in state.changes if c.knob == knob and c.previous_value is not None]
    return max([period(state.job, rules, state.steps)] + [as_period(v) for v in values])


def leading(steps: Sequence[JobStep], min_steps: int, min_s: float, every: int,
            enough_steps: Optional[int] = None) -> tuple[list[JobStep], bool]:
    """The oldest steps of ``steps`` covering ``min_s`` seconds (or ``enough_steps`` steps, whichever comes first)
    and ``min_steps`` steps in whole periods of ``every`` steps, and True; or all whole periods there are so far,
    and False."""
    every = max(1, every)
    total_s = 0.0
    for i, step in enumerate(steps):
        total_s += step.step_time_s
        n = i + 1
        covered = total_s >= min_s or (enough_steps is not None and n >= enough_steps)
        if n % every == 0 and n >= min_steps and covered:
            return list(steps[:n]), True
    return list(steps[:len(steps) - len(steps) % every]), False


def wait_to_cover(steps: Sequence[JobStep], min_steps: int, min_s: float, every: int,
                  enough_steps: Optional[int] = None) -> Wait:
    """How far ``steps`` (a measurement growing from its first step) is from covering ``min_steps`` steps and
    ``min_s`` seconds (or ``enough_steps`` steps) in whole periods: at least the steps to the next period boundary
    that reaches both."""
    every = max(1, every)
    n = len(steps)
    need_n = max(min_steps, n + 1)
    need_n += (-need_n) % every
    enough = None if enough_steps is None else max(enough_steps - n, need_n - n)
    return Wait(steps=need_n - n, seconds=max(0.0, min_s - sum(s.step_time_s for s in steps)), enough_steps=enough)


def window_wait(rules: RuleSet, every: int) -> Wait:
    """A new window's worth of steps: ``window_min_s`` of step time or ``window_enough_steps`` steps, in whole
    periods."""
    ctl = rules.controller
    steps = max(ctl.window_min_steps, every)
    return Wait(steps=steps, seconds=ctl.window_min_s, enough_steps=max(steps, ctl.window_enough_steps))


def steps_needed(rules: RuleSet, every: int) -> int:
    """How many of a job's newest steps its windows can need (the before window of a verdict, the after window
    grown to its bound, settle and cooldown steps, a period's rounding on each) and at least ``window_max_steps``
    (what a window may read), at most ``steps_read_max``: bounded by memory, not by a count that a fast job's
    seconds never fill (200 steps of 12 ms never covered a 4 s window). Steps of a second or more reach the
    seconds first and need fewer."""
    ctl = rules.controller
    every = max(1, every)
    one = max(ctl.window_enough_steps, ctl.verdict_enough_steps, ctl.verdict_max_after_periods * every) + 2 * every
    return min(ctl.steps_read_max, max(ctl.window_max_steps, 2 * one + ctl.settle_steps + ctl.cooldown_steps + 1))


def before_window(steps: Sequence[JobStep], rules: RuleSet, every: int) -> list[JobStep]:
    """The newest of ``steps`` (oldest first) a verdict takes as its before window: ``verdict_before_s`` of step
    time or ``verdict_enough_steps`` steps, in whole periods of ``every``; oldest first."""
    ctl = rules.controller
    newest_first, _ = leading(list(steps)[::-1], ctl.window_min_steps, ctl.verdict_before_s, every,
                              ctl.verdict_enough_steps)
    return newest_first[::-1]


def window_evidence(steps: Sequence[JobStep]) -> dict[str, Any]:
    tp = throughput(steps)
    return {"steps": [steps[0].step, steps[-1].step], "n_steps": len(steps),
            "seconds": round(sum(s.step_time_s for s in steps), 3),
            "samples_per_s": None if tp is None else round(tp, 3)}


def last_applied_step(state: JobState) -> Optional[int]:
    last = last_applied(state)
    return None if last is None else last.applied_step


def last_applied(state: JobState, knob: Optional[str] = None) -> Optional[StoredChange]:
    """The change that took effect last, of ``knob`` where one is named (None: none yet)."""
    applied = [c for c in state.changes if c.status == APPLIED and c.applied_step is not None
               and (knob is None or c.knob == knob)]
    return max(applied, key=lambda c: c.applied_step) if applied else None
