"""What a drifting job would have done without a change: its seconds per sample as a line in the tokens per sample it
generates, fitted at one setting, so a window's throughput is read at one reference length.

Why: a decode step generates one token position at a time, so its time grows with the response length, and RL
responses grow or shrink as the policy learns. Samples/s then follows the length for the whole run — 128 → 512
tokens over 200 steps is −27 % … −9 % across every 20-step window — and a controller that waits for samples/s to
settle (the warm-up gate, ``verdict.unsettled``) never decides; one that does not wait credits a raise with the
lengths that shrank meanwhile (or charges it with those that grew). Fitted on the steps at the setting a change
left (the job's own, ``seconds per sample = a + b × tokens per sample``), each step's samples are scaled to what
they would have been at the reference length: the trend gate, the verdict's t-test and the warm-up checks then read
throughput at equal length — a raise judged by its own effect, a drift that the tokens explain not "unsettled",
and a warm-up (a trend the tokens do not explain) still one.

The length is the step's ``tokens`` over its samples, else the mean completion length its framework logged. No model
(the plain samples/s) where the job reports neither, where its lengths barely moved (their spread under
``drift_min_length_spread_pct``: nothing to correct, and nothing to fit a slope on), or where step time is not
surely longer at longer lengths (a job whose step time does not follow its length has no drift of that kind).
The after window is read with the old setting's line: a change is taken to scale a step's time by the same factor
at every length (exact where the step is all decode, as the bench's jobs and a weight-bound decode are; where a
fixed part of the step differs between the settings, the verdict is off by that part's share of the length's drift
across the two windows).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from trimtab.control.memory_fit import tokens_per_sample
from trimtab.grading.rules import ControllerSettings
from trimtab.grading.window import JobStep

MIN_STEPS = 8        # fewer steps put no line through their lengths
SLOPE_SURE_T = 3.0   # the slope is used only this many standard errors above 0


def length_of(step: JobStep) -> Optional[float]:
    """The step's tokens per sample: its ``tokens`` over its samples, else the mean completion length its framework
    logged (TRL's ``completions/mean_length``, verl's ``response_length/mean``); None when it reports neither."""
    length = tokens_per_sample(step)
    return length if length is not None else step.rl.get("completion_mean_tokens") or None


@dataclass(frozen=True)
class LengthModel:
    """Seconds per sample at one setting: ``a_s + b_s_per_token × tokens per sample``, and the length the job's
    throughput is read at (``ref_tokens``: the mean of the steps it was fitted on)."""
    a_s: float
    b_s_per_token: float
    ref_tokens: float
    spread_pct: float  # the lengths' coefficient of variation over the fitted steps
    steps: tuple[int, int]  # first and last step fitted

    def seconds_per_sample(self, tokens: float) -> float:
        return self.a_s + self.b_s_per_token * tokens

    def scale(self, step: JobStep) -> float:
        """How many times faster the step would have run at the reference length (1 without tokens)."""
        tokens = length_of(step)
        if tokens is None:
            return 1.0
        at_ref, at_own = self.seconds_per_sample(self.ref_tokens), self.seconds_per_sample(tokens)
        return at_own / at_ref if at_ref > 0 and at_own > 0 else 1.0

    def at_reference(self, steps: Sequence[JobStep]) -> list[JobStep]:
        """``steps`` with their samples scaled to the reference length (samples/s over them is then throughput at
        equal length); steps without samples or tokens as they are."""
        return [s if not s.samples else replace(s, samples=s.samples * self.scale(s)) for s in steps]

    def evidence(self) -> dict[str, Any]:
        return {"seconds_per_sample": f"{self.a_s:.4g} + {self.b_s_per_token:.4g} × tokens per sample",
                "reference_tokens_per_sample": round(self.ref_tokens, 1),
                "length_spread_pct": round(self.spread_pct, 1), "fitted_steps": list(self.steps),
                "why": "throughput read at the reference length: the job's lengths drift and its step time with them"}


def fit(steps: Sequence[JobStep], ctl: ControllerSettings) -> Optional[LengthModel]:
    """The line through the steps' seconds per sample against their tokens per sample (steps at one setting), or
    None (see the module docstring)."""
    points = [(length_of(s), s.step_time_s / s.samples, s.step) for s in steps
              if s.samples and s.step_time_s > 0]
    points = [(x, y, i) for x, y, i in points if x is not None and x > 0]
    if len(points) < MIN_STEPS:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = 100.0 * statistics.pstdev(xs) / mx
    if spread < ctl.drift_min_length_spread_pct:
        return None
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    residual = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (len(xs) - 2)
    if b <= 0 or b < SLOPE_SURE_T * math.sqrt(residual / sxx):
        return None
    if a < 0:  # noise put the line below the origin: time per token, no fixed part (never a negative time)
        a, b = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return LengthModel(a, b, mx, spread, (points[0][2], points[-1][2]))


def at_equal_length(fitted_on: Sequence[JobStep], steps: Sequence[JobStep],
                    ctl: ControllerSettings) -> tuple[list[JobStep], Optional[LengthModel]]:
    """``steps`` read at the reference length of a model fitted on ``fitted_on`` (steps at one setting), and the
    model; ``steps`` unchanged and None without one."""
    model = fit(fitted_on, ctl)
    return (model.at_reference(steps), model) if model is not None else (list(steps), None)
