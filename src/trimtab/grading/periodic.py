"""Heavy steps that recur: a validation pass, a checkpoint save, every k steps (``trainer.test_freq``,
``eval_steps``, ``save_steps``) — the job's own schedule, not its setting's throughput, and not noise either.

Why: a 20-step window holds one such step at 10× a training step. A rule is judged over the window *and* each half
(a signal must be sustained), and the half that holds the validation step reads generation at 44 % where the
window reads 59 %: the rule never fires while the job is generation-bound on every training step. A verdict whose
before window holds one and whose after window does not reads the schedule as the change's gain. The knobs do
nothing to a validation pass, so its steps are left out of every window and verdict, and the evidence names them:

* steps at least ``periodic_heavy_x`` times the median of their neighbours (±``NEIGHBOURS`` steps), recurring at one
  spacing ``periodic_min_repeats`` times or more back to back (random stalls 1 in 30, in no named phase, made 3 in
  a row in 22 of 300 simulated runs of 200 steps, 4 in 1), and every heavy step on that schedule;
* and, before the schedule has shown itself, a heavy step whose extra time the job reports as its validation or
  checkpoint phase (those phases are the schedule by name).

Steps heavy in a phase the knobs act on (generation every k steps, TRL's ``steps_per_generation``) are not left out:
that is the job's work at its setting (``step_facts.generation_cadence`` names the cadence).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from trimtab.grading.window import JobStep

NEIGHBOURS = 5
SCHEDULE_PHASES = ("validation", "checkpoint")  # the contract's phases that are the job's schedule by name
KNOB_PHASES = ("generation", "evaluation", "communication", "update", "wait")  # what the knobs act on


@dataclass(frozen=True)
class HeavySteps:
    """The recurring heavy steps of a run of steps: their spacing (None: named by phase, no spacing shown yet),
    the phase that holds their extra time, how heavy, and which steps."""
    every: Optional[int]
    phase: str
    x_neighbours: float   # median heavy step over its neighbours' median
    steps: tuple[int, ...]

    def evidence(self) -> dict[str, Any]:
        how = f"every {self.every} steps" if self.every else "named by the job's own phase"
        return {"every_steps": self.every, "phase": self.phase, "x_neighbours": round(self.x_neighbours, 2),
                "steps": list(self.steps[-20:]), "count": len(self.steps),
                "how": f"{self.phase} {how}, {self.x_neighbours:.1f}× the steps around it: left out of every window "
                       f"and verdict (the job's schedule; the knobs do nothing to it)"}


def _neighbour_x(steps: Sequence[JobStep], i: int) -> float:
    around = [s.step_time_s for s in steps[max(0, i - NEIGHBOURS):i] + steps[i + 1:i + 1 + NEIGHBOURS]]
    median = statistics.median(around) if around else 0.0
    return steps[i].step_time_s / median if median > 0 else 0.0


def _extra_phase(step: JobStep) -> str:
    """The phase holding most of the step's time ("other" for what no phase accounts for)."""
    named = {p: v for p, v in step.phases_s.items() if v}
    rest = step.step_time_s - sum(named.values())
    phase, seconds = max(named.items(), key=lambda kv: kv[1], default=("other", 0.0))
    return phase if seconds >= rest else "other"


def _schedule(heavy: list[int], min_repeats: int) -> tuple[Optional[int], int]:
    """(spacing, first step) of the longest run of ``heavy`` steps at one spacing, back to back (a, a + k, a + 2k, …),
    when it holds ``min_repeats`` steps or more; (None, 0) otherwise. Back to back: random stalls give two equal gaps
    somewhere now and then, rarely a run of them."""
    best: tuple[int, Optional[int], int] = (1, None, 0)  # (run length, spacing, first step)
    run, start = 1, 0
    for i in range(1, len(heavy)):
        gap = heavy[i] - heavy[i - 1]
        if i >= 2 and gap == heavy[i - 1] - heavy[i - 2]:
            run += 1
        else:
            run, start = 2, i - 1
        if gap >= 2 and run > best[0]:
            best = (run, gap, heavy[start])
    return (best[1], best[2]) if best[1] is not None and best[0] >= min_repeats else (None, 0)


def heavy_steps(steps: Sequence[JobStep], heavy_x: float, min_repeats: int) -> Optional[HeavySteps]:
    """The recurring heavy steps of ``steps`` (oldest first), None when there are none (or ``heavy_x`` is 0)."""
    if heavy_x <= 1.0 or len(steps) < 2 * NEIGHBOURS:
        return None
    steps = list(steps)
    heavy = [(s, x) for i, s in enumerate(steps) if (x := _neighbour_x(steps, i)) >= heavy_x]
    heavy = [(s, x, _extra_phase(s)) for s, x in heavy]
    heavy = [h for h in heavy if h[2] not in KNOB_PHASES]
    if not heavy:
        return None
    every, anchor = _schedule([h[0].step for h in heavy], min_repeats)
    if every is not None:
        chosen = [h for h in heavy if (h[0].step - anchor) % every == 0]
    else:
        every = None
        chosen = [h for h in heavy if h[2] in SCHEDULE_PHASES]
    if not chosen:
        return None
    phase = Counter(h[2] for h in chosen).most_common(1)[0][0]
    return HeavySteps(every, phase, statistics.median(h[1] for h in chosen), tuple(h[0].step for h in chosen))


def without_heavy(steps: Sequence[JobStep], heavy_x: float,
                  min_repeats: int) -> tuple[list[JobStep], Optional[HeavySteps]]:
    """``steps`` less their recurring heavy steps, and what was left out (None: nothing)."""
    found = heavy_steps(steps, heavy_x, min_repeats)
    if found is None:
        return list(steps), None
    out = set(found.steps)
    return [s for s in steps if s.step not in out], found
