"""The most a raise of the queue knob (prefetch) can gain: it lets generation run ahead of the rest of the step and
hides that rest behind it — it makes no phase faster. Where a job's phases lie on its step's path one after another
(they add up to the step), the step cannot get shorter than its generation: a raise from a setting whose steps spend
a share r outside generation gains at most 1 / (1 − r).

Why: a host whose speed shifts in regimes (20 % for ~8 steps at a time) turned prefetch 2 → 4 on a job whose scoring
was already hidden at 2 (generation 100 % of the step; the raise costs 2.4 %) into "+13 %, 100 % sure" and "+6 %, 97 %
sure" (the regime-shifting bench job, seeds 4 and 7): a gain that no overlap could have brought, the host's own
speed-up kept as the move's. A verdict whose whole 95 % interval lies above what the move could bring is not judged
(the interval, not the estimate: a raise that hides all of the rest gains exactly the most, and a fast regime
reads it above — prefetch 0 → 2 there, +78 % true, read +83 % and +113 %): the move goes back to be measured again (once; a second
such reading of the same move is the job's flat top, back to the known setting) — and a raise whose most is under
the dead band is not made at all (``nothing_to_hide``). Not read where the phases overlap
the step (a worker's generation reported beside the trainer's wait: the bounded queues) — generation is then off the
step's path and says nothing of its floor.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from trimtab.control.plan import last_applied
from trimtab.control.settle import settled_from
from trimtab.grading.rules import RuleSet
from trimtab.grading.window import JobStep
from trimtab.store.changes import StoredChange

if TYPE_CHECKING:
    from trimtab.control.plan import JobState

ON_PATH_SLACK = 0.05  # phases that add up to at most this much over the step lie on its path (timer granularity)
GENERATION = "generation"
BARRIERS = ("communication",)  # phases that pause generation: no queue depth hides them


def beyond_overlap(change: StoredChange, rules: RuleSet, before: Sequence[JobStep], low_pct: float) -> Optional[dict]:
    """Where ``change`` raised the queue knob and the verdict's whole interval (from ``low_pct``, its lower end, %)
    lies above the most that hiding the before window's non-generation share could bring: what it could bring (for
    the evidence), else None (another knob, a lower, phases off the path, no generation reported)."""
    if change.knob != rules.controller.queue_knob or change.previous_value is None or change.value is None \
            or float(change.value) <= float(change.previous_value):
        return None
    most = most_gain(before)
    if most is None:
        return None
    if low_pct <= (most - 1.0) * 100.0:
        return None
    return {"outside_generation_pct": round(100.0 * (1.0 - 1.0 / most), 1),
            "most_gain_pct": round(100.0 * (most - 1.0), 1), "gain_low_pct": round(low_pct, 1)}


def most_gain(steps: Iterable[JobStep]) -> Optional[float]:
    """The most (a ratio) that hiding the share of these steps outside generation and the weight sync could bring,
    where their phases lie on the step's path; None where they overlap it or no generation is reported (on fewer than
    two steps)."""
    timed = [s for s in steps if s.step_time_s > 0 and s.phases_s.get(GENERATION) is not None]
    if len(timed) < 2:
        return None
    on_path = statistics.fmean(sum(v for v in s.phases_s.values() if v is not None) / s.step_time_s for s in timed)
    if on_path > 1.0 + ON_PATH_SLACK:
        return None
    rest = statistics.fmean(max(0.0, 1.0 - (s.phases_s[GENERATION] + _barrier_s(s)) / s.step_time_s) for s in timed)
    return 1.0 / (1.0 - rest) if rest < 1.0 else math.inf


def _barrier_s(step: JobStep) -> float:
    return sum(step.phases_s.get(name) or 0.0 for name in BARRIERS)


def nothing_to_hide(state: "JobState", rules: RuleSet, knob: str, current: float, new: float) -> Optional[str]:
    """Why raising the queue knob from ``current`` to ``new`` cannot pay, else None: on the steps the job ran at its
    depth (since it was set, after its settle step) the phases lie on the step's path and the share outside
    generation is so small that hiding all of it would bring less than the dead band — the rest is hidden already.
    The regime-shifting host's scoring was hidden at prefetch 2 (generation 100 % of the step): each trial of 4 cost
    2.4 %, and a fast regime read it as a gain."""
    ctl = rules.controller
    if knob != ctl.queue_knob or new <= current:
        return None
    set_at = last_applied(state, knob)
    since = settled_from(set_at, rules) if set_at is not None else 0
    most = most_gain(s for s in state.steps if s.step >= since)
    if most is None or (most - 1.0) * 100.0 >= ctl.dead_band_pct:
        return None
    return (f"{100.0 * (1.0 - 1.0 / most):.1f} % of the step is outside generation and the weight sync at {knob}={current:g}: "
            f"hiding all "
            f"of it would bring +{100.0 * (most - 1.0):.1f} %, under the {ctl.dead_band_pct:g} % dead band")
