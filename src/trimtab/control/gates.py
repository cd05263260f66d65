"""Why a plan decided nothing, as data: the gate that held the job (and the rule it held, where one fires), the
window it read, what data it misses, and the step at which it expects to decide (None: not before the job moves —
its signal, knobs or throughput). Each plan carries one (:attr:`trimtab.control.plan.Plan.gate`); the daemon keeps
the latest per job and serves it on ``GET /v1/jobs/{name}`` and in ``trimtab check``.

Why: a rule at ACT with "recent decisions: none" and no word of why (issue 38) leaves a user to guess between a
controller that is broken and one that waits for something — and for what.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from trimtab.grading.window import JobStep

MODE_OFF = "mode_off"                  # the job's mode is off
COLLECTING = "collecting_steps"        # not a window's worth of steps since the last change (+ settle, cooldown)
APPLYING = "waiting_for_apply"         # the change decided waits for the job to apply it
MEASURING = "measuring"                # the change in flight is being measured (its verdict comes at expects_step)
IN_FLIGHT = "change_in_flight"         # another change (an admin's, a rollback) waits for the job
DRAINING = "draining"                  # a prefetch raise's queue drains before another knob's move is judged
SETTLING = "settling"                  # the before window's throughput still trends: no baseline to judge on
NOT_MEASURABLE = "not_measurable"      # the window has no measurable throughput (no samples, lost steps)
ADVISED = "advised_recently"           # advise mode: this advice was given within advice_repeat_s
BOUND = "bound_reached"                # the rule's knobs are at their bounds
MEMORY = "memory_headroom"             # a raise does not fit in memory (or memory is unknown)
HOLD = "hold"                          # a verdict that holds, the bracket search, a refusal: no move left
SAFETY = "safety_blocks"               # a safety rule fires, cannot act and blocks the rules after it
NO_RULE = "no_rule_fires"              # no rule fires on the window (nothing to decide)
GATES = (MODE_OFF, COLLECTING, APPLYING, MEASURING, IN_FLIGHT, DRAINING, SETTLING, NOT_MEASURABLE, ADVISED, BOUND,
         MEMORY, HOLD, SAFETY, NO_RULE)


@dataclass(frozen=True)
class Gate:
    name: str                          # one of GATES
    rule: Optional[str] = None         # the rule it held (None: no rule involved)
    why: Optional[str] = None          # the skipped actions and why, the trend, …
    window: Optional[dict] = None      # the window it read (steps, n_steps, seconds, samples_per_s)
    missing: Optional[str] = None      # the data it waits for
    expects_step: Optional[int] = None  # the step at which it expects to decide; None: not before the job moves

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def no_action_gate(skipped: Sequence[str]) -> str:
    """The gate that stopped every action of a rule, from the skipped actions' reasons: at their bounds, memory,
    else a hold (a verdict, the bracket, a refusal)."""
    if skipped and all(" is at its " in s for s in skipped):
        return BOUND
    if any("memory" in s.lower() for s in skipped):
        return MEMORY
    return HOLD


def expected_step(steps: Sequence[JobStep], more_steps: int, more_s: float = 0.0,
                  enough_steps: Optional[int] = None) -> Optional[int]:
    """The step by which ``more_steps`` more steps holding ``more_s`` more seconds (or ``enough_steps`` steps) will
    be in, at the pace of the newest steps; None without steps to tell the pace."""
    if not steps:
        return None
    recent = [s.step_time_s for s in steps[-20:] if s.step_time_s > 0]
    n = max(1, more_steps)
    if more_s > 0 and recent:
        n = max(n, math.ceil(more_s / (sum(recent) / len(recent)) - 1e-9))
    if enough_steps is not None:
        n = min(n, max(more_steps, enough_steps))
    return steps[-1].step + n
