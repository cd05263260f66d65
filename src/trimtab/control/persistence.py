"""How much a job's throughput persists from one sync period to the next while nothing changes: the lag-1
autocorrelation of its per-period log throughputs, measured on its own history.

Why: a verdict's t-test takes the periods of a window as independent samples. On a host whose speed shifts in
regimes (the lent H200: one fixed setting read 70–90 samples/s in runs of 3–20 steps) they are not — a window of 8
periods that sits in one fast regime is one sample, not eight, and its mean is far less certain than its spread over
√8 says: a +16 % "gain, 99.9 % sure" for a move that did nothing. With lag-1 autocorrelation ρ the variance of a
mean of n periods is about (1 + ρ) / (1 − ρ) times the independent one; every sample a verdict or a re-measure takes
has its spread widened by that factor (``inflation``) — and, where periods persist, taken as at least the history's
own spread (a window that sat in one regime is calm inside and still one draw of the regimes). The warm-up test is
not widened (``verdict.unsettled`` says why).

Measured where nothing moved: each stretch of steps between two applied changes (after the settle steps), in whole
periods of the sync interval it ran at, residuals from the stretch's own mean (a level shift caused by a change is
not persistence), its unsettled head left out and what still trends taken from its own line (nor is a warm-up's or a
drift's trend), pooled over the stretches, the small-sample bias added back, and only the part the history shows
beyond one standard error (the estimate less 1/√periods), from 32 periods of history on. Clamped to [0,
``persistence_max``]: anything below is taken as independence; ``persistence_max`` 0 switches it off.

The same stretches say how noisy one step of the job is (``step_noise``): a side of a verdict that holds one sync
period has no spread of its own, and the assumed 10 % a step made a −8 % move at sync 8 on a ±5 % job
"inconclusive" on one period each side (the bench's banking job ran its loser 16 steps more, until a second period
was in). The stretch in flight (the setting now, a change's after window) is not in it, nor a queue raise's drain: a
move's own level shift is not the job's noise. The assumed noise stays in as a prior worth ``ASSUMED_NOISE_DOF`` degrees of freedom (a few
quiet steps do not make a one-step side sure: 10 identical 45 s steps before a change are not a noiseless job).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from trimtab.contract.statuses import APPLIED
from trimtab.control.verdict import Sample, fit_line, lone_outlier, unsettled
from trimtab.control.settle import drained_from, settled_from
from trimtab.grading.rules import RuleSet
from trimtab.grading.window import JobStep, as_period, chunk_rates

if TYPE_CHECKING:
    from trimtab.control.plan import JobState

MIN_PERIODS = 4  # a stretch shorter than this says nothing about persistence (its residuals are mostly its mean)
MIN_HISTORY_PERIODS = 32  # nor does less history than this in all: 19 periods of ±20 % noise read ρ 0.38 by chance
MIN_STEP_NOISE_DOF = 12   # a step noise read on fewer degrees of freedom than this is no better than the assumed one
ASSUMED_NOISE_DOF = 4     # … and the assumed one (assumed_noise_pct) is pooled with it as if read on this many


def _stretches(state: "JobState", rules: RuleSet, drained: bool = False) -> list[tuple[int, int, int]]:
    """(first step, last step + 1, period) of each stretch of unchanged knobs, oldest first (``drained``: from the
    end of a queue raise's drain, settle.py — its fast steps are the raise landing, not the job's noise)."""
    ctl = rules.controller
    applied = sorted((c for c in state.changes if c.status == APPLIED and c.applied_step is not None),
                     key=lambda c: c.applied_step)
    spec = state.job.knobs.get(ctl.period_knob)
    period_now = as_period(spec.get("value") if spec else None)
    periods = []  # the period each stretch ran at, newest last: walk the period knob's changes back from now
    at = period_now
    for c in reversed(applied):
        periods.append(at)
        if c.knob == ctl.period_knob and c.previous_value is not None:
            at = as_period(c.previous_value)
    periods.append(at)
    periods.reverse()  # periods[i]: before applied[i] (i < len), periods[-1]: after the last change
    starts = [0] + [drained_from(c, rules, "") if drained else settled_from(c, rules) for c in applied]
    ends = [c.applied_step for c in applied] + [math.inf]
    return [(s, e, p) for s, e, p in zip(starts, ends, periods) if e > s]


def _settled_part(stretch: Sequence[JobStep], every: int, rules: RuleSet) -> tuple[Sequence[JobStep], bool]:
    """The stretch without its unsettled head — while the trend test says it has not settled (a warm-up, the steps
    after a restart) its older half is dropped: a warm-up's curve is not persistence — and whether what is left
    still trends (a drift: its residuals are then taken from its own line, not its mean — only then: a line fitted
    to every short stretch would take most of a regime's swing with it)."""
    while True:
        trending = unsettled(stretch, every, rules.controller) is not None
        if not trending or len(stretch) < 2 * MIN_PERIODS * every:
            return stretch, trending
        stretch = stretch[(len(stretch) // every // 2) * every:]


@dataclass(frozen=True)
class Persistence:
    """What the job's history says about its periods at unchanged knobs: ``rho`` (lag-1 autocorrelation, 0 where it
    shows none) and ``var_log`` (their variance on the log scale, pooled over the stretches; None without history)."""
    rho: float = 0.0
    var_log: Optional[float] = None
    lone_x: float = 0.0  # a lone period this many times off its window's median is left out (lone_period_x)
    step_rho_max: float = 0.8  # the cap on steps moving together inside a period (persistence_max; step_noise.py)
    step_noise: Optional[tuple[float, int]] = None  # one step's log-throughput variance at the job's earlier
                                                    # settings and its degrees of freedom (None: too little history)

    @property
    def inflation(self) -> float:
        """How many times wider the variance of a window's mean is than independent periods would make it."""
        return (1.0 + self.rho) / (1.0 - self.rho)

    @property
    def var_floor(self) -> Optional[float]:
        """Where periods persist, a window's own spread is no measure of its mean's: one that sat in one regime
        is calm inside and still one draw of the regimes. Its spread is then taken as at least the history's."""
        return self.var_log if self.rho > 0 else None

    def sample(self, steps: Sequence[JobStep], period: int = 1) -> Optional[Sample]:
        """The window's per-period sample, its spread widened for persistence, a lone stalled period left out; a
        window of one period is given the job's step noise from its history (widened alike)."""
        history = None if self.step_noise is None else (self.step_noise[0] * self.inflation, self.step_noise[1])
        return Sample.of_steps(steps, period, self.inflation, self.var_floor, self.lone_x, self.step_rho_max, history)

    def evidence(self) -> dict[str, Any]:
        return {"rho": round(self.rho, 3), "var_log": None if self.var_log is None else round(self.var_log, 6),
                "inflation": round(self.inflation, 2)}


NONE = Persistence()


def persistence(state: "JobState", rules: RuleSet) -> Persistence:
    """The job's persistence at unchanged knobs (see the module docstring)."""
    cap, lone_x = rules.controller.persistence_max, rules.controller.lone_period_x
    if cap <= 0:
        return Persistence(lone_x=lone_x, step_rho_max=0.0)
    num = den = 0.0
    periods = stretches = 0
    numbers = [s.step for s in state.steps]  # oldest first: each stretch is one slice
    noise_sum, noise_dof = 0.0, 0
    for first, end, every in _stretches(state, rules, drained=True):
        lo, hi = bisect_left(numbers, first), bisect_left(numbers, end)
        if end != math.inf and hi - lo >= 2 * every:
            var, dof = _step_var(state.steps[lo:hi], every, rules, lone_x, cap)
            noise_sum, noise_dof = noise_sum + var * dof, noise_dof + dof
    for first, end, every in _stretches(state, rules):
        lo, hi = bisect_left(numbers, first), bisect_left(numbers, end)
        if hi - lo < MIN_PERIODS * every:
            continue
        stretch, trending = _settled_part(state.steps[lo:hi], every, rules)
        logs = [math.log(r) for r in chunk_rates(stretch, every) if r > 0]
        lone = lone_outlier(logs, lone_x)  # a stall is not the host's spread either
        if lone is not None:
            logs = logs[:lone] + logs[lone + 1:]
        if len(logs) < MIN_PERIODS:
            continue
        mean = sum(logs) / len(logs)
        resid = fit_line(logs)[1] if trending else [x - mean for x in logs]
        num += sum(a * b for a, b in zip(resid, resid[1:]))
        den += sum(r * r for r in resid)
        periods, stretches = periods + len(logs), stretches + 1
    noise = None
    if noise_dof >= MIN_STEP_NOISE_DOF:
        prior = math.log1p(rules.controller.assumed_noise_pct / 100.0) ** 2 * ASSUMED_NOISE_DOF
        noise = ((noise_sum + prior) / (noise_dof + ASSUMED_NOISE_DOF), noise_dof + ASSUMED_NOISE_DOF)
    if den <= 0 or periods < MIN_HISTORY_PERIODS:
        return Persistence(lone_x=lone_x, step_rho_max=cap, step_noise=noise)
    var_log = den / (periods - stretches)
    rho = num / den
    # Residuals from each stretch's own mean read persistence low by about (1 + 3ρ)/m over stretches of m periods
    # (Kendall's bias; 8-period stretches read a true 0.6 as 0.25): added back.
    rho += (1.0 + 3.0 * rho) / (periods / stretches)
    # Only what the history shows beyond one standard error (about 1/√periods; 84 % sure, one-sided): a job with
    # independent periods seldom has its verdicts slowed by this estimate's own noise (a wrong "sure" verdict costs
    # more than a slow one, so not 95 %).
    return Persistence(min(cap, max(0.0, rho - 1.0 / math.sqrt(periods))), var_log, lone_x, cap, noise)


def _step_var(stretch: Sequence[JobStep], every: int, rules: RuleSet, lone_x: float, cap: float) -> tuple[float, int]:
    """One step's log-throughput variance in a closed stretch of unchanged knobs, and its degrees of freedom (0: it
    says nothing) — its settled part in whole periods, read as a verdict reads a window (``Sample.of_steps``: the
    periods' steps, a lone stall left out)."""
    settled, _ = _settled_part(stretch, every, rules)
    sample = Sample.of_steps(settled, every, lone_x=lone_x, step_rho_max=cap)
    if sample is None or sample.var_log is None:
        return 0.0, 0
    return sample.var_log * sample.steps_per_period, sample.dof
