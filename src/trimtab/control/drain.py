"""Where a raise of the queue knob starts to be judged when its drain shows in its own steps.

A raise of the prefetch depth lands with a bank: the worker runs ahead into the deeper queue and the steps right
after it drain that bank, reading faster than the setting runs (``settle.py``). The raise's own verdict reads from
its settle step (a wait there cost the CPU workloads that bank nothing goals of their own), so where a bank did
form, its verdict compares a window whose first steps are fast and whose later ones are the setting itself: a level
shift inside the after window, read as noise. The test cannot tell, the after window grows to its longest, and the
job runs the worse setting all that while (the bench's banking job: prefetch 2 → 4, −7 % true, 8 fast steps then
the setting, "inconclusive" for 48 steps; within 5 % of its best only from step 87).

So the steps tell: once the after window holds as many whole periods past the drain (``drain_end``, rounded up to
whole periods of the sync interval: a raise by one drains in half a period of 8) as the drain itself, the drain's
periods are compared with those after them, and where the later ones read surely slower
(``remeasure_confidence_pct``, beyond the dead band) — a bank drained — the verdict starts past the drain. A job that
banks nothing reads the same on both sides and is judged from its settle step as before; a verdict closed before
the steps past the drain are in is unchanged. Where a side holds one period, the job's step noise from its earlier
settings is its spread (``history``, ``persistence.py``), as in the verdict. So a raise is not judged on its drain
alone (``drain_only``): with the job's own noise one period each side can be sure, and the banking job kept
prefetch 2 → 4 (−7 % true) as a +5 % gain read on the 8 fast steps of its drain.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from trimtab.control.settle import drain_end
from trimtab.control.verdict import WORSE, Sample, compare
from trimtab.grading.rules import RuleSet
from trimtab.grading.window import JobStep
from trimtab.store.changes import StoredChange


def _drain_periods_end(change: StoredChange, rules: RuleSet, first: int, every: int) -> Optional[int]:
    """The step after the whole periods from ``first`` that hold the drain of a raise of the queue knob; None where
    ``change`` is no such raise or its drain ends by ``first``."""
    if change.knob != rules.controller.queue_knob or change.value is None or change.previous_value is None \
            or not float(change.value) > float(change.previous_value):
        return None
    every = max(1, int(every))
    periods = -(-(drain_end(change, rules) - first) // every)
    return first + periods * every if periods >= 1 else None


def drain_only(change: StoredChange, rules: RuleSet, after: Sequence[JobStep], first: int, every: int) -> bool:
    """The steps after a raise of the queue knob (``after``, from ``first``) do not yet reach one whole period
    past its drain: a verdict now would read the drain alone."""
    end = _drain_periods_end(change, rules, first, every)
    return end is not None and (not after or after[-1].step < end + max(1, int(every)) - 1)


def drain_read(change: StoredChange, rules: RuleSet, steps: Sequence[JobStep], first: int,
               every: int, history: Optional[Callable[[], Optional[tuple[float, int]]]] = None) -> Optional[dict]:
    """The drain of a raise of the queue knob as its steps read it — ``{"from", "to", "ratio", "confidence_pct"}``
    (the steps after it over the drain's) — when the steps after it read surely slower; else None (no raise of the
    queue knob, a drain shorter than a period, too few steps past it yet, or no sure difference). ``first``: where
    the after window starts without it (its settle step, or the drain's end already)."""
    ctl = rules.controller
    end = _drain_periods_end(change, rules, first, every)  # past the whole periods that hold the drain
    if end is None:
        return None
    every = max(1, int(every))
    periods = (end - first) // every
    drained = [s for s in steps if first <= s.step < end]
    after = [s for s in steps if s.step >= end]
    after = after[:len(after) - len(after) % every]
    if len(drained) < periods * every or len(after) < periods * every:
        return None
    noise = history() if history is not None else None
    bank = Sample.of_steps(drained, every, step_rho_max=ctl.persistence_max, history=noise)
    setting = Sample.of_steps(after, every, step_rho_max=ctl.persistence_max, history=noise)
    if bank is None or setting is None:
        return None
    v = compare(bank, setting, ctl, ctl.remeasure_confidence_pct)
    if v.result != WORSE:
        return None
    return {"from": first, "to": end, "ratio": round(v.ratio, 4), "confidence_pct": round(v.confidence_pct, 1)}

