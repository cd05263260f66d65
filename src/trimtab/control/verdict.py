"""Keep or roll back by a test, not a dead band: a t-test (pooled, or Welch's when the spreads differ) on the log
of the per-period throughputs before and after a change (a test on their ratio), with a confidence and a 95 %
interval of the ratio for the decision.

Per-period, not per-step: with a sync every 4th step, steps alternate fast and slow; a period is one sample.
A side with fewer than two periods has no variance of its own: it is given the job's own step-to-step noise where its
history shows it (``history_var``: its steps at earlier settings, ``persistence.py``), else ``assumed_noise_pct``, the
step-to-step noise seen on real jobs, averaged over the steps its one period holds — one 45 s step keeps all of it (one slow step
against one fast one is "inconclusive", not a verdict), a period of 32 short steps a sixth of it (32 steps with a
sync at the end average like ~28 steps: (Σt)² / Σt²).

One period of a window at least ``lone_period_x`` times slower (or faster) than the window's median period, and
the only one, is left out of its sample (``lone_outlier``): a stall — a checkpoint or validation pass inside a
step, a GC pause, a host hiccup — says nothing about the setting, and one 10 s step among 0.9 s ones moves a
7-period mean by ~15 % (on the H200, run 15, a benchmark's own 10.3 s refill step entered a verdict: −22.5 % with it,
−7.8 % without). Two or more such periods are the window's own pattern and stay.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from trimtab.control.lost_steps import measurable_periods
from trimtab.control.step_noise import within_periods
from trimtab.grading.rules import ControllerSettings
from trimtab.grading.window import JobStep, chunk_rates, throughput

GAIN, WORSE, NO_GAIN, INCONCLUSIVE = "gain", "worse", "no_gain", "inconclusive"


@dataclass(frozen=True)
class Sample:
    """Summary of one window's per-period throughputs on the log scale (what a later re-measurement compares)."""
    n: int
    mean_log: float
    var_log: Optional[float]  # None: fewer than two periods
    steps_per_period: float = 1.0  # how many steps' noise a period averages ((Σt)² / Σt², mean over the periods)
    left_out: tuple = ()  # (first step, × the window's median period) of a lone stalled period left out
    lost: tuple = ()  # the lost steps (lost_steps.LostStep) of the periods left out for having no rate
    var_dof: Optional[int] = None  # the degrees of freedom of var_log: n − 1 (None), or k(n − 1) where it was read
                                   # from the periods' steps (step_noise.py)
    step_rho: Optional[float] = None  # where it was: the steps' lag-1 autocorrelation within a period taken in
    history_var: Optional[float] = None  # one step's log-throughput variance the job's earlier settings showed: what
                                         # a one-period side is given instead of ``assumed_noise_pct``
    history_dof: Optional[int] = None    # … and its degrees of freedom

    @property
    def dof(self) -> int:
        """The degrees of freedom of ``var_log`` (at least 1)."""
        return max(1, self.var_dof if self.var_dof is not None else self.n - 1)

    @property
    def step_var(self) -> Optional[float]:
        """The variance of one step's log throughput this window's steps show (the period's, times the steps it
        averages): what a one-period side of the same job is given instead of ``assumed_noise_pct``."""
        return None if self.var_dof is None or self.var_log is None else self.var_log * self.steps_per_period

    @classmethod
    def of(cls, rates: Sequence[float], steps_per_period: float = 1.0) -> Optional["Sample"]:
        logs = [math.log(r) for r in rates if r > 0]
        if not logs:
            return None
        return cls(len(logs), statistics.fmean(logs), statistics.variance(logs) if len(logs) > 1 else None,
                   max(1.0, steps_per_period))

    @classmethod
    def of_steps(cls, steps: Sequence[JobStep], period: int = 1, inflate: float = 1.0,
                 var_floor: Optional[float] = None, lone_x: float = 0.0,
                 step_rho_max: Optional[float] = None,
                 history: Optional[tuple[float, int]] = None) -> Optional["Sample"]:
        """The per-period sample of a window of steps (whole periods of ``period`` steps); its spread widened
        ``inflate`` times, from at least ``var_floor``, where the job's periods persist (see
        ``trimtab.control.persistence``); a lone period ``lone_x`` times off the median left out (0: none). A period
        holding a lost step (an OOM's ``samples=0``, no samples: ``lost_steps.py``) has no rate: left out, and its
        lost steps named (``lost``); None when no period is measurable. ``step_rho_max`` not None: where periods
        hold several steps, their variance is read from the steps (``step_noise.py``: k(n − 1) degrees of freedom
        instead of n − 1), steps moving together inside a period taken in up to this lag-1 autocorrelation.
        ``history``: (one step's log variance, its degrees of freedom) from the job's earlier settings, for a side of
        one period (``persistence.step_noise``)."""
        spans, lost = measurable_periods(steps, period)
        weights = [sum(s.step_time_s for s in span) ** 2 / sum(s.step_time_s ** 2 for s in span) for span in spans]
        rates = [throughput(span) for span in spans]  # each > 0: a lost step is one whose rate could not be
        left_out: tuple = ()
        lone = lone_outlier([math.log(r) for r in rates], lone_x)
        if lone is not None:
            median = statistics.median(rates)
            left_out = ((spans[lone][0].step, round(max(median / rates[lone], rates[lone] / median), 2)),)
            rates, weights = rates[:lone] + rates[lone + 1:], weights[:lone] + weights[lone + 1:]
        sample = cls.of(rates, statistics.fmean(weights) if weights else 1.0)
        if sample is None:
            return None
        var_log, var_dof, step_rho = sample.var_log, None, None
        if step_rho_max is not None:
            kept = spans if lone is None else spans[:lone] + spans[lone + 1:]
            noise = within_periods(kept, step_rho_max)
            if noise is not None:
                var_log, var_dof, step_rho = noise.var_log, noise.dof, noise.rho
        if var_log is not None and (inflate != 1.0 or var_floor is not None):
            var_log = max(var_log, var_floor or 0.0) * inflate
        return cls(sample.n, sample.mean_log, var_log, sample.steps_per_period, left_out, tuple(lost), var_dof,
                   step_rho, *(history if history is not None else (None, None)))

    @classmethod
    def from_evidence(cls, d: Any) -> Optional["Sample"]:
        try:
            return cls(int(d["n"]), float(d["mean_log"]), None if d.get("var_log") is None else float(d["var_log"]),
                       float(d.get("steps_per_period", 1.0)),
                       var_dof=None if d.get("var_dof") is None else int(d["var_dof"]))
        except (TypeError, KeyError, ValueError):
            return None

    def variance(self, ctl: ControllerSettings) -> float:
        """The variance of one period's log throughput: measured (≥ 2 periods), else the job's step-to-step noise
        from its history (or, without one, the assumed noise) averaged over the period's steps; never below
        ``min_noise_pct``."""
        floor = math.log1p(ctl.min_noise_pct / 100.0) ** 2  # a noiseless synthetic job must not divide by zero
        if self.var_log is not None:
            return max(floor, self.var_log)
        if self.history_var is not None:
            return max(floor, self.history_var / self.steps_per_period)
        return max(floor, math.log1p(ctl.assumed_noise_pct / 100.0) ** 2 / self.steps_per_period)

    @property
    def noise_dof(self) -> Optional[int]:
        """The degrees of freedom of :meth:`variance` (None: the assumed noise, a known variance)."""
        return self.dof if self.var_log is not None else self.history_dof

    def evidence(self) -> dict[str, Any]:
        out = {"n": self.n, "mean_log": round(self.mean_log, 6),
               "var_log": None if self.var_log is None else round(self.var_log, 8),
               "steps_per_period": round(self.steps_per_period, 2)}
        if self.var_dof is not None:
            out.update(var_dof=self.var_dof, var_from="the periods' steps (step_noise.py)", step_rho=self.step_rho)
        if self.var_log is None and self.history_var is not None:
            out.update(step_var_log=round(self.history_var, 8), step_var_dof=self.history_dof,
                       step_var_from="the job's steps at its earlier settings (persistence.py)")
        if self.left_out:
            out["left_out"] = [{"first_step": step, "x_median_period": x,
                                "why": "a lone period this far from the window's median period (a stall), "
                                       "beyond lone_period_x"} for step, x in self.left_out]
        if self.lost:
            out["lost_steps"] = [x.evidence() for x in self.lost[:20]]
            out["lost_steps_count"] = len(self.lost)
        return out


def lone_outlier(logs: Sequence[float], x: float) -> Optional[int]:
    """The index of the one period (log throughputs) at least ``x`` times slower or faster than the median period
    of the window, when it is the only one; None when there is none, or more than one (the window's own pattern:
    a regime, a setting that stalls), or fewer than 4 periods (no median to speak of), or ``x`` ≤ 1 (off)."""
    if x <= 1.0 or len(logs) < 4:
        return None
    median = statistics.median(logs)
    far = [i for i, v in enumerate(logs) if abs(v - median) >= math.log(x)]
    return far[0] if len(far) == 1 else None


@dataclass(frozen=True)
class Verdict:
    result: str                   # gain | worse | no_gain | inconclusive
    ratio: float                  # after / before (geometric means of the periods)
    confidence_pct: float         # 100 × (1 − two-sided p) that the ratio is not 1
    ci_pct: tuple[float, float]   # 95 % interval of the change, % (ratio − 1)
    n_before: int
    n_after: int
    method: str                   # pooled t | welch | welch, assumed noise on a one-period side

    @property
    def not_lower_pct(self) -> float:
        """How likely, by the test, the new setting is not lower than the old (one-sided, %): 50 at a ratio of 1."""
        half = self.confidence_pct / 2.0
        return 50.0 + half if self.ratio >= 1.0 else 50.0 - half

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


def _floor(ctl: ControllerSettings) -> float:
    return math.log1p(ctl.min_noise_pct / 100.0) ** 2


def _spread_differs_p(vb: float, db: int, va: float, da: int) -> float:
    """Two-sided p of the F-test that the two sides' variances (``db``, ``da`` degrees of freedom) are equal."""
    from scipy.stats import f as f_dist

    cdf = float(f_dist.cdf(vb / va, db, da))
    return min(1.0, 2.0 * min(cdf, 1.0 - cdf))


def _standard_error(before: Sample, after: Sample, ctl: ControllerSettings) -> tuple[float, float, str]:
    """(standard error of the log ratio, degrees of freedom, method). The step-to-step noise is mostly the job's,
    not the setting's: while an F-test cannot tell the two sides' spreads apart they are pooled (Student's t: a
    4-period first window borrows the after window's degrees of freedom); when it can, Welch's t."""
    vb, va = before.variance(ctl), after.variance(ctl)
    if (before.var_log is None) != (after.var_log is None):
        one, other = (before, after) if before.var_log is None else (after, before)
        if other.step_var is not None:
            # one period on a side: the other side's steps say how noisy a step of this job is (k(n − 1) degrees
            # of freedom), averaged over the steps of this side's period
            borrowed = max(_floor(ctl), other.step_var / one.steps_per_period)
            vb, va = (borrowed, va) if one is before else (vb, borrowed)
            return (math.sqrt(vb / before.n + va / after.n), float(other.dof),
                    "welch, the other side's step noise on a one-period side")
    if before.var_log is None or after.var_log is None:
        sb, sa = vb / before.n, va / after.n
        dofs = [(x, s.noise_dof) for x, s in ((sb, before), (sa, after)) if s.noise_dof is not None]
        if not any(s.var_log is None and s.history_var is not None for s in (before, after)):
            # the assumed noise is a known variance: a normal test
            return math.sqrt(sb + sa), 1e6, "welch, assumed noise on a one-period side"
        # the job's step noise from its history: a variance with degrees of freedom of its own (Welch–Satterthwaite)
        df = (sb + sa) ** 2 / sum(x * x / d for x, d in dofs)
        return math.sqrt(sb + sa), df, "welch, the job's step noise from its history on a one-period side"
    nb, na = before.n, after.n
    db, da = before.dof, after.dof
    if _spread_differs_p(vb, db, va, da) >= 1.0 - ctl.pool_unless_spread_differs_pct / 100.0:
        pooled = (db * vb + da * va) / (db + da)
        return math.sqrt(pooled * (1.0 / nb + 1.0 / na)), float(db + da), "pooled t (the spreads agree)"
    sb, sa = vb / nb, va / na
    return math.sqrt(sb + sa), (sb + sa) ** 2 / (sb ** 2 / db + sa ** 2 / da), "welch"


def compare(before: Sample, after: Sample, ctl: ControllerSettings, confidence_pct: Optional[float] = None) -> Verdict:
    """A t-test on the log throughputs: is after/before different from 1, and by how much (95 % interval)?
    ``confidence_pct``: how sure "different" must be (default: the verdicts' ``confidence_pct``)."""
    se, df, method = _standard_error(before, after, ctl)
    diff = after.mean_log - before.mean_log
    p = min(1.0, 2.0 * _t_sf(abs(diff) / se, df))
    half = _t_ppf(0.975, df) * se
    lo, hi = math.expm1(diff - half) * 100, math.expm1(diff + half) * 100
    ratio = math.exp(diff)
    effect = ctl.dead_band_pct
    significant = p < 1.0 - (ctl.confidence_pct if confidence_pct is None else confidence_pct) / 100.0
    if significant and (ratio - 1) * 100 < -effect:
        result = WORSE
    elif significant and (ratio - 1) * 100 > effect:
        result = GAIN
    elif significant or (lo > -effect and hi < effect):
        result = NO_GAIN  # measurable but smaller than the least effect worth a change, or shown to be within it
    else:
        result = INCONCLUSIVE
    return Verdict(result, ratio, 100.0 * (1.0 - p), (lo, hi), before.n, after.n, method)


def changed_level(then: Optional[Sample], now: Optional[Sample], ctl: ControllerSettings,
                  confidence_pct: Optional[float] = None) -> bool:
    """The job's throughput at the same setting has moved measurably since ``then`` (a slowdown, a new phase of
    training): an old verdict taken at ``then`` no longer says anything about now. ``confidence_pct``: how sure
    (default ``remeasure_confidence_pct``)."""
    if then is None or now is None:
        return False
    # Looked at once a window for as long as the verdict stands: a stricter line than a verdict's, or noise alone
    # would re-open every verdict within a few dozen windows.
    sure = ctl.remeasure_confidence_pct if confidence_pct is None else confidence_pct
    return compare(then, now, ctl, sure).result in (GAIN, WORSE)



@dataclass(frozen=True)
class Trend:
    """A window's throughput trend: the change it makes across the window, and how sure the test is of it."""
    change_pct: float      # the fitted line's end over its start, % − 100
    confidence_pct: float  # 100 × (1 − two-sided p) that the slope is not 0
    n: int                 # periods

    def evidence(self) -> dict[str, Any]:
        return {"change_pct": round(self.change_pct, 2), "confidence_pct": round(self.confidence_pct, 1),
                "periods": self.n}


def fit_line(ys: Sequence[float]) -> tuple[float, list[float], float]:
    """Least squares through ``ys`` at x = 0, 1, …: (slope, residuals, Σ(x − x̄)²)."""
    n = len(ys)
    mx, my = (n - 1) / 2.0, statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sxx
    return slope, [y - my - slope * (x - mx) for x, y in enumerate(ys)], sxx


@dataclass(frozen=True)
class _Line:
    """A least-squares line through a window's per-period log throughputs (the trend tests' one fit)."""
    logs: list[float]
    slope: float
    var: float  # of the residuals, from at least the floor it was fitted with
    sxx: float

    @classmethod
    def through(cls, steps: Sequence[JobStep], period: int, var_floor: float) -> Optional["_Line"]:
        logs = [math.log(r) for r in chunk_rates(steps, max(1, int(period))) if r > 0]
        if len(logs) < 4:
            return None
        slope, residuals, sxx = fit_line(logs)
        return cls(logs, slope, max(var_floor, sum(r * r for r in residuals) / (len(logs) - 2)), sxx)

    @property
    def n(self) -> int:
        return len(self.logs)

    def slope_p(self) -> float:
        """Two-sided p that the slope is 0."""
        return min(1.0, 2.0 * _t_sf(abs(self.slope) / math.sqrt(self.var / self.sxx), self.n - 2))

    def trend(self) -> Trend:
        return Trend(math.expm1(self.slope * (self.n - 1)) * 100.0, 100.0 * (1.0 - self.slope_p()), self.n)


def unsettled(steps: Sequence[JobStep], period: int, ctl: ControllerSettings,
              confidence_pct: Optional[float] = None) -> Optional[Trend]:
    """The trend that says a window's throughput has not settled — a line fitted to the log of its per-period
    throughputs moves by more than the dead band across the window, ``settled_confidence_pct`` sure (a warm-up
    still climbing, the steps after a restart or a mode switch) — else None (settled, or too few periods to tell).
    A stationarity test on the data, not a count of steps to skip: a job whose first 120 steps are its warm-up is
    not a baseline until its throughput stops moving, one without a warm-up is one at once. A trend test, not a
    comparison of the window's halves: a steep warm-up inflates each half's own spread and hides from that.
    ``confidence_pct``: how sure (default ``settled_confidence_pct``). Not widened for persistence (see
    ``trimtab.control.persistence``): early in a job the only history is its warm-up, and a trend test weakened by
    it let a warm-up through; a regime read as a trend costs a re-measure, not a wrong verdict."""
    floor = math.log1p(ctl.min_noise_pct / 100.0) ** 2 / 100.0  # a noiseless line must not divide by zero
    line = _Line.through(steps, period, floor)
    if line is None:
        return None
    moved = abs(line.slope * (line.n - 1)) > math.log1p(ctl.dead_band_pct / 100.0)
    sure = ctl.settled_confidence_pct if confidence_pct is None else confidence_pct
    return line.trend() if moved and line.slope_p() < 1.0 - sure / 100.0 else None


TREND_LINE_MIN_PERIODS = 8  # fewer periods put a line's end too loosely: at ±20 % step noise real +20–35 % gains over
                            # 4–5-period before windows did not clear it, and were re-measured again and again


def gain_within_trend(before: Sequence[JobStep], period: int, after: Sample,
                      ctl: ControllerSettings) -> Optional[Trend]:
    """The before window's trend when it, not the change, may be what the after window gained: the before window
    climbed (its fitted line goes the verdict's way) and the after window is not surely above that line's end by
    more than the dead band, at the verdicts' confidence. A mean-based verdict credits a still-settling baseline —
    a warm-up's last 1–3 % read as a +3 % gain, "99.9 % sure" — that the stricter settled test let through; the
    line's end is the job's level when the change came. Applied only to a gain, only when the before window went
    the same way (its end is a noisier baseline than its mean: a real +15 % still clears it, a +3 % on a warm-up's
    tail does not)."""
    line = _Line.through(before, period, math.log1p(ctl.min_noise_pct / 100.0) ** 2)
    if line is None or line.n < TREND_LINE_MIN_PERIODS or line.slope <= 0:
        return None
    if after.mean_log <= statistics.fmean(line.logs):
        return None
    return None if _above_line_end(line, after, ctl) else line.trend()


def _above_line_end(line: _Line, after: Sample, ctl: ControllerSettings) -> bool:
    """The after window is surely above the line's end (the job's level when the change came) by more than the
    dead band, at the verdicts' confidence: the change's, whatever the line did before it."""
    n = line.n
    end = statistics.fmean(line.logs) + line.slope * (n - 1) / 2.0
    se = math.sqrt(line.var * (1.0 / n + ((n - 1) / 2.0) ** 2 / line.sxx) + after.variance(ctl) / after.n)
    beyond = after.mean_log - end - math.log1p(ctl.dead_band_pct / 100.0)
    return beyond > 0 and 2.0 * _t_sf(beyond / se, n - 2 + max(1, after.n - 1)) < 1.0 - ctl.confidence_pct / 100.0


def past_a_short_trend(before: Sequence[JobStep], period: int, after_steps: Sequence[JobStep], after_period: int,
                       after: Sample, ctl: ControllerSettings) -> bool:
    """A gain that a short before window's trend cannot explain. A line through fewer than
    ``TREND_LINE_MIN_PERIODS`` periods rests on a residual spread of 2–5 degrees of freedom: 5 steps that ran a
    chance +9 % read "99.3 % sure" (a job's first move, prefetch 0 → 2 at +12 %, re-measured: 16 steps late). Such a
    trend explains nothing where the after window has stopped moving (no trend of its own at the verdicts'
    confidence) and sits surely above the line's end by more than the dead band: a warm-up that went on would still
    climb there, one that ended when the change came left the job at the line's end."""
    line = _Line.through(before, period, math.log1p(ctl.min_noise_pct / 100.0) ** 2)
    if line is None or line.n >= TREND_LINE_MIN_PERIODS:
        return False
    return unsettled(after_steps, after_period, ctl, ctl.confidence_pct) is None and _above_line_end(line, after, ctl)
