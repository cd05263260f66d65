"""Keep or roll back by a test, not a dead band: Welch's t on the log of the per-period throughputs before and
after a change (a test on their ratio), with a confidence and a 95 % interval of the ratio for the decision.

Per-period, not per-step: with a sync every 4th step, steps alternate fast and slow; a period is one sample.
A side with fewer than two periods (45 s steps) has no variance of its own: it is given ``assumed_noise_pct``
(the step-to-step noise seen on real jobs), so one slow step against one fast one is "inconclusive", not a verdict.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from trimtab.rebalancer.rules import ControllerSettings

GAIN, WORSE, NO_GAIN, INCONCLUSIVE = "gain", "worse", "no_gain", "inconclusive"


@dataclass(frozen=True)
class Sample:
    """Summary of one window's per-period throughputs on the log scale (what a later re-measurement compares)."""
    n: int
    mean_log: float
    var_log: Optional[float]  # None: fewer than two periods

    @classmethod
    def of(cls, rates: Sequence[float]) -> Optional["Sample"]:
        logs = [math.log(r) for r in rates if r > 0]
        if not logs:
            return None
        return cls(len(logs), statistics.fmean(logs), statistics.variance(logs) if len(logs) > 1 else None)

    @classmethod
    def from_evidence(cls, d: Any) -> Optional["Sample"]:
        try:
            return cls(int(d["n"]), float(d["mean_log"]), None if d.get("var_log") is None else float(d["var_log"]))
        except (TypeError, KeyError, ValueError):
            return None

    def evidence(self) -> dict[str, Any]:
        return {"n": self.n, "mean_log": round(self.mean_log, 6),
                "var_log": None if self.var_log is None else round(self.var_log, 8)}


@dataclass(frozen=True)
class Verdict:
    result: str                   # gain | worse | no_gain | inconclusive
    ratio: float                  # after / before (geometric means of the periods)
    confidence_pct: float         # 100 × (1 − two-sided p) that the ratio is not 1
    ci_pct: tuple[float, float]   # 95 % interval of the change, % (ratio − 1)
    n_before: int
    n_after: int
    method: str                   # welch | welch, assumed noise on a one-period side

    def evidence(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ratio=round(self.ratio, 4), confidence_pct=round(self.confidence_pct, 1),
                   ci_pct=[round(v, 1) for v in self.ci_pct])
        return out


def _t_sf(t: float, df: float) -> float:
    from scipy.stats import t as student_t  # lazily: the daemon's start does not pay for scipy.stats

    return float(student_t.sf(t, df))


def _t_ppf(q: float, df: float) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, df))


def compare(before: Sample, after: Sample, ctl: ControllerSettings) -> Verdict:
    """Welch's t on the log throughputs: is after/before different from 1, and by how much (95 % interval)?"""
    assumed = math.log1p(ctl.assumed_noise_pct / 100.0) ** 2
    floor = math.log1p(ctl.min_noise_pct / 100.0) ** 2  # a noiseless synthetic job must not divide by zero
    vb = max(floor, assumed if before.var_log is None else before.var_log)
    va = max(floor, assumed if after.var_log is None else after.var_log)
    sb, sa = vb / before.n, va / after.n
    se = math.sqrt(sb + sa)
    assumed_side = before.var_log is None or after.var_log is None
    if assumed_side:
        df = 1e6  # the assumed noise is a known variance: a normal test
    else:
        df = (sb + sa) ** 2 / ((sb ** 2) / max(1, before.n - 1) + (sa ** 2) / max(1, after.n - 1))
    diff = after.mean_log - before.mean_log
    p = min(1.0, 2.0 * _t_sf(abs(diff) / se, df))
    half = _t_ppf(0.975, df) * se
    lo, hi = math.expm1(diff - half) * 100, math.expm1(diff + half) * 100
    ratio = math.exp(diff)
    effect = ctl.dead_band_pct
    significant = p < 1.0 - ctl.confidence_pct / 100.0
    if significant and (ratio - 1) * 100 < -effect:
        result = WORSE
    elif significant and (ratio - 1) * 100 > effect:
        result = GAIN
    elif significant or (lo > -effect and hi < effect):
        result = NO_GAIN  # measurable but smaller than the least effect worth a change, or shown to be within it
    else:
        result = INCONCLUSIVE
    return Verdict(result, ratio, 100.0 * (1.0 - p), (lo, hi), before.n, after.n,
                   "welch, assumed noise on a one-period side" if assumed_side else "welch")


def changed_level(then: Optional[Sample], now: Optional[Sample], ctl: ControllerSettings) -> bool:
    """The job's throughput at the same setting has moved measurably since ``then`` (a slowdown, a new phase of
    training): an old verdict taken at ``then`` no longer says anything about now."""
    if then is None or now is None:
        return False
    return compare(then, now, ctl).result in (GAIN, WORSE)
