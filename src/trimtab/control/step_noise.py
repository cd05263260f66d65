"""The spread of a window's sync periods read from its steps, not only from the periods themselves.

Why: a verdict's sample is one throughput per sync period (a sync every k steps makes steps alternate fast and
slow). At a long sync interval a window holds few periods — 2 of 8 steps, 4 of 16 — and their variance, with 1–3
degrees of freedom, is a guess: on the bench's noisy two-rank job (±20 % a step) sync 8 → 16 (+11 % true) read
"inconclusive" at its first look in 6 of 10 runs and its after window grew to 64 steps; a t-test on 2 and 4 periods
needs t > 2.8 with a spread that reads 5× too calm or too wide by chance.

The steps of a period are k draws of the job's step-to-step noise. Steps at the same place in their period (the
sync step, the steps between) run the same work, so their spread across the window's periods measures the noise at
that place with n − 1 degrees of freedom each, k(n − 1) in all; the variance of a period's log throughput is their
sum (on the log scale: each step's deviation over the period's mean time and samples). Steps that move together
inside a period (a host that drifts within seconds) make a period's sum vary more than that sum: the lag-1
autocorrelation of neighbouring steps' deviations within a period, what of it shows beyond one standard error, widens
it as an AR(1) sum would. The job's persistence from one period to the next is ``persistence.py``'s, applied on top.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from trimtab.grading.window import JobStep


@dataclass(frozen=True)
class StepNoise:
    """One period's log-throughput variance, from the window's steps."""
    var_log: float   # the variance of one period's log throughput, widened for steps that move together
    dof: int         # degrees of freedom: k(n − 1) for n periods of k steps
    rho: float       # the lag-1 autocorrelation within a period taken into var_log (0: none shown)


def _ar1_sum_factor(rho: float, k: int) -> float:
    """How many times the variance of a sum of k AR(1) steps exceeds that of k independent ones."""
    return 1.0 + 2.0 * sum((1.0 - h / k) * rho ** h for h in range(1, k))


def within_periods(spans: Sequence[Sequence[JobStep]], rho_max: float) -> Optional[StepNoise]:
    """The period variance read from the steps of ``spans`` (whole periods of equal length, each with a rate), or
    None where the steps cannot say more than the periods do: fewer than 2 periods, periods of one step, or steps
    without samples."""
    n = len(spans)
    k = len(spans[0]) if spans else 0
    if n < 2 or k < 2 or any(len(span) != k for span in spans):
        return None
    if any(s.samples is None for span in spans for s in span):
        return None
    mean_t = statistics.fmean(sum(s.step_time_s for s in span) for span in spans)
    mean_n = statistics.fmean(sum(float(s.samples) for s in span) for span in spans)
    if mean_t <= 0 or mean_n <= 0:
        return None
    # log(N/T) of a period moves by Σ_j (n_j − n̄_j)/N̄ − (t_j − t̄_j)/T̄: each step's deviation from its place's mean
    d = [[float(s.samples) / mean_n - s.step_time_s / mean_t for s in span] for span in spans]
    place = [statistics.fmean(d[i][j] for i in range(n)) for j in range(k)]
    r = [[d[i][j] - place[j] for j in range(k)] for i in range(n)]
    sq = sum(x * x for row in r for x in row)
    var_sum = sq / (n - 1)
    if sq <= 0:
        return StepNoise(0.0, k * (n - 1), 0.0)
    pairs = n * (k - 1)
    rho = sum(row[j] * row[j + 1] for row in r for j in range(k - 1)) / sq * (n * k) / pairs
    shown = min(rho_max, max(0.0, rho - 1.0 / math.sqrt(pairs)))
    return StepNoise(var_sum * _ar1_sum_factor(shown, k), k * (n - 1), round(shown, 4))
