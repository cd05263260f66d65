"""What the job is made of — each phase's share of its steps and its tokens per sample — so that "the job moved"
means the job and not its host.

A value measured worse stays out until the job itself moved by more than the loss (issue 20: "its length, its
phase shares"). The throughput level alone cannot tell which moved: a host that slows every step 20 % for a while
(the H200's regimes, a neighbour arriving) moves the level and leaves every relative effect as it was, and verdicts
re-opened on it retried known losers (the regime-shifting host: 2 of 10 seeds, one after a verdict said nothing was
left on that side). So a verdict keeps its windows' composition (per-step means and spreads), and a level that moved
re-opens it only where the composition moved too: a phase's share of the step by more than the verdict's effect
(7 % of the step for a 7 % loss), or the tokens per sample by more than it, as surely as the level
(``remeasure_confidence_pct``). Lengths that grow move the tokens per sample; a phase that grows moves the shares; a
host that slows everything moves neither. A verdict recorded without a composition (older ones), or one with
nothing to compare with the job's steps now, is judged by the level alone, as before.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Optional, Sequence

from trimtab.contract.step_report import NAMED_PHASES
from trimtab.grading.rules import ControllerSettings
from trimtab.grading.window import JobStep

TOKENS_PER_SAMPLE = "log_tokens_per_sample"  # on the log scale: "by more than the effect" is then a ratio
_MIN_VAR = 1e-8  # a part that never varied (a job all generation) still has a finite test


def _part(values: Sequence[float]) -> Optional[list]:
    if len(values) < 2:
        return None
    return [round(statistics.fmean(values), 6), round(statistics.variance(values), 8), len(values)]


def composition(steps: Sequence[JobStep]) -> dict[str, list]:
    """Per part, [mean, variance, n] over the steps that report it: each named phase's share of the step
    (a fraction, capped at 1: a worker's phase may outlast its step) and the log of tokens per sample."""
    out: dict[str, list] = {}
    timed = [s for s in steps if s.step_time_s > 0]
    for phase in NAMED_PHASES:
        shares = [min(1.0, s.phases_s[phase] / s.step_time_s) for s in timed if s.phases_s.get(phase) is not None]
        part = _part(shares)
        if part is not None:
            out[phase] = part
    lengths = [math.log(s.rl["tokens"] / s.samples) for s in steps
               if (s.rl or {}).get("tokens") and s.samples and s.rl["tokens"] > 0 and s.samples > 0]
    part = _part(lengths)
    if part is not None:
        out[TOKENS_PER_SAMPLE] = part
    return out


def moved(then: Mapping[str, Any], now: Mapping[str, Any], effect: float, ctl: ControllerSettings) -> Optional[str]:
    """What of the job's composition moved by more than ``effect`` (a fraction of the step for a share, a log ratio
    for the tokens per sample) — the whole ``remeasure_confidence_pct`` interval of the shift beyond it — or None.
    "nothing to compare" where no part is on both sides (then the level alone decides, as before)."""
    from trimtab.control.verdict import _t_ppf

    compared = 0
    for name, old in then.items():
        new = now.get(name)
        if not isinstance(old, (list, tuple)) or len(old) != 3 or new is None:
            continue
        (m1, v1, n1), (m2, v2, n2) = old, new
        compared += 1
        s1, s2 = max(float(v1), _MIN_VAR) / n1, max(float(v2), _MIN_VAR) / n2
        df = (s1 + s2) ** 2 / (s1 ** 2 / max(1, n1 - 1) + s2 ** 2 / max(1, n2 - 1))
        half = _t_ppf(1.0 - (1.0 - ctl.remeasure_confidence_pct / 100.0) / 2.0, df) * math.sqrt(s1 + s2)
        if abs(m2 - m1) - half > effect:
            what = "tokens per sample" if name == TOKENS_PER_SAMPLE else f"{name} share"
            shown = (f"{math.exp(m1):.0f} → {math.exp(m2):.0f}" if name == TOKENS_PER_SAMPLE
                     else f"{100 * m1:.1f} → {100 * m2:.1f} % of the step")
            return f"{what} {shown}"
    return None if compared else "nothing to compare"
