"""A rule of the rules file as typed data: its knob actions, the rule itself (signal, lines, advice), and the
controller's timing settings.

These are what the controller and the balance checks read; where they come from (``rules.toml``, a file, overrides,
and every check on them) is :mod:`trimtab.grading.rules_parse`, and the set of them is
:class:`trimtab.grading.rules.RuleSet`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional

OPS = {"mul": operator.mul, "div": operator.truediv, "add": operator.add}  # an action's op: new = op(value, by)


@dataclass(frozen=True)
class Action:
    knob: str
    op: str
    by: float
    needs_memory_headroom: bool = False
    strong_by: Optional[float] = None  # the step when the rule's signal is above its strong_above line
    to_memory_fit: bool = False  # a lower goes to the largest value the memory forecast says fits (at most ÷by)

    def apply(self, value: float, strong: bool = False) -> float:
        by = self.strong_by if strong and self.strong_by is not None else self.by
        return OPS[self.op](value, by)

    @property
    def direction(self) -> int:
        """+1 when the action raises the knob, −1 when it lowers it."""
        up = (self.op == "mul" and self.by > 1) or (self.op == "div" and self.by < 1) or (self.op == "add" and self.by > 0)
        return 1 if up else -1

    def describe(self) -> str:
        sym = {"mul": "×", "div": "÷", "add": "+" if self.by >= 0 else "−"}[self.op]
        by = abs(self.by) if self.op == "add" else self.by
        return f"{self.knob} {sym}{by:g}"

    def describe_move(self, old: float, new: float) -> str:
        """The move from ``old`` to ``new`` in this action's terms: ``×4`` for a strong-evidence step of a ×2 rule,
        ``×2`` for a ×4 step cut at the knob's bound. A decision's reason says what was done, not the rule's step."""
        if self.op in ("mul", "div") and old > 0 and new > 0:
            sym, ratio = ("×", new / old) if self.op == "mul" else ("÷", old / new)
            return f"{self.knob} {sym}{ratio:.3g}"
        return f"{self.knob} {'+' if new >= old else '−'}{abs(new - old):g}"


@dataclass(frozen=True)
class Rule:
    name: str
    priority: int
    scope: str
    signal: str
    unit: str
    healthy_below: float
    act_above: float
    actions: tuple[Action, ...]
    advice: str
    safety: bool = False
    placement_advice: bool = False
    gpu_signal: Optional[str] = None
    fallback_gpu_signal: Optional[str] = None
    strong_above: Optional[float] = None  # over the whole window and each half: the actions take strong_by steps
    follow_above: Optional[float] = None  # after a measured gain, one more step while the signal stays above this

    def grade(self, value: float) -> str:
        if value > self.act_above:
            return "act"
        if value >= self.healthy_below:
            return "watch"
        return "ok"


@dataclass(frozen=True)
class ControllerSettings:
    window_min_steps: int = 1
    window_min_s: float = 4.0
    window_max_steps: int = 400
    window_enough_steps: int = 20
    steps_read_max: int = 5000
    settle_steps: int = 1
    cooldown_steps: int = 0
    dead_band_pct: float = 2.0
    confidence_pct: float = 95.0
    pool_unless_spread_differs_pct: float = 95.0
    remeasure_confidence_pct: float = 99.0
    assumed_noise_pct: float = 10.0
    min_noise_pct: float = 1.0
    verdict_before_s: float = 12.0
    verdict_max_after_s: float = 12.0
    verdict_max_after_periods: int = 6
    verdict_max_after_cap_s: float = 60.0
    verdict_enough_steps: int = 60
    verdict_before_max_periods: int = 2
    settled_confidence_pct: float = 99.9
    ladder_look_further: int = 1
    ladder_gain_pct: float = 10.0
    drift_retries: int = 1
    drift_confidence_pct: float = 90.0
    keep_unproven_likely_pct: float = 75.0
    keep_in_bracket_likely_pct: float = 25.0
    persistence_max: float = 0.8
    outlier_x_median: float = 100.0
    lone_period_x: float = 3.0
    drift_min_length_spread_pct: float = 2.0
    periodic_heavy_x: float = 3.0
    periodic_min_repeats: int = 4
    bracket_min_gap_pct: float = 15.0
    retry_after_s: float = 600.0
    advice_repeat_s: float = 600.0
    plan_retry_min_s: float = 1.0
    plan_retry_max_s: float = 60.0
    raise_batch_max_mem_pct: float = 85.0
    raise_batch_max_fragmentation_pct: float = 15.0
    memory_margin_pct: float = 3.0
    memory_line_pct: float = 95.0
    memory_fit_half_life_s: float = 60.0
    memory_lookahead_s: float = 5.0
    memory_lower_lookahead_x: float = 1.0
    memory_min_length_spread_pct: float = 5.0
    memory_trend_short_s: float = 5.0
    memory_follow_min_pct: float = 3.0
    memory_follow_lookahead_steps: float = 4.0
    memory_first_climb_rungs: int = 2
    memory_first_window_x: float = 0.5
    gpu_min_samples: int = 3
    probe_baseline_steps: int = 5
    period_knob: str = "sync_every"
    queue_knob: str = "prefetch"
    queue_raise_settle_steps: float = 4.0
    queue_raise_needs_fill: bool = True
    report_phase_slack_s: float = 0.05
    report_phase_max_x_step: float = 20.0
    report_phases_sum_max_x_step: float = 40.0
    report_max_steps_ahead: int = 10_000
    stale_after_intervals: float = 5.0
    stale_min_s: float = 3.0
    report_clock_skew_s: float = 60.0
    end_state_window_s: float = 300.0
    end_state_util_low_pct: float = 60.0
    end_state_util_high_pct: float = 75.0
    end_state_step_cv_max_pct: float = 5.0
    end_state_scaling_min_pct: float = 90.0
    end_state_history_steps: int = 2000
