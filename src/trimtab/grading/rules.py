"""The rules file: the thresholds, windows and actions as data (``rules.toml``), with overrides.

Loading checks everything once, at start, so a typo never silently does nothing: an unknown rule or key, a value of
the wrong type, healthy above act, an unknown knob operation — each is a :class:`RulesError` naming the file, the
line and the reason. The controller and the balance checks read only the typed :class:`RuleSet`.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from trimtab.grading.learning_rules import LEARNING_TABLE, LearningRulesError, LearningSettings, build as build_learning

SHIPPED = "rules.toml"
OPS = {"mul": operator.mul, "div": operator.truediv, "add": operator.add}  # an action's op: new = op(value, by)
SCOPES = ("job", "gpu")
KNOWN_SIGNALS = {
    "ooms", "mem_used_pct", "fragmentation_pct", "collective_latency_x_baseline", "pcie_pct_of_peak",
    "communication_share_pct", "generation_share_pct", "evaluation_share_pct", "wait_share_pct", "update_share_pct",
    "utilization_spread_pts", "memory_forecast_pct",
}


class RulesError(ValueError):
    """A rules file or override cannot be used; the message says where and why."""


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


@dataclass(frozen=True)
class RuleSet:
    controller: ControllerSettings
    rules: tuple[Rule, ...] = field(default_factory=tuple)  # by priority
    learning: LearningSettings = field(default_factory=LearningSettings)  # which knobs change what is learned

    def __getitem__(self, name: str) -> Rule:
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(rule.name == name for rule in self.rules)

    def names(self) -> list[str]:
        return [r.name for r in self.rules]

    def with_overrides(self, overrides: Optional[Mapping[str, Any]], source: str = "per-job rules") -> "RuleSet":
        """This set with ``{"controller": {...}, "rules": {name: {...}}}`` (or ``{name: {...}}``) applied."""
        if not overrides:
            return self
        data = _as_document(self)
        _merge(data, _normalise(overrides), source, text=None)
        return _build(data, source, text=None)


def _as_document(rs: RuleSet) -> dict[str, Any]:
    rules = {}
    for r in rs.rules:
        d = {f.name: getattr(r, f.name) for f in fields(Rule) if f.name != "name"}
        d["actions"] = [{f.name: getattr(a, f.name) for f in fields(Action)} for a in r.actions]
        rules[r.name] = {k: v for k, v in d.items() if v is not None}
    return {"controller": {f.name: getattr(rs.controller, f.name) for f in fields(ControllerSettings)},
            "rules": rules, LEARNING_TABLE: rs.learning.to_document()}


def _normalise(overrides: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(overrides, Mapping):
        raise RulesError(f"overrides must be a table, got {type(overrides).__name__}")
    for key in ("rules", "controller", LEARNING_TABLE):
        if key in overrides and not isinstance(overrides[key], Mapping):
            raise RulesError(f"{key} must be a table, got {type(overrides[key]).__name__}")
    if "rules" in overrides or "controller" in overrides or LEARNING_TABLE in overrides:
        extra = set(overrides) - {"rules", "controller", LEARNING_TABLE}
        if extra:
            raise RulesError(f"unknown top-level keys {sorted(extra)}: expected [controller], [learning] and "
                             f"[rules.<name>]")
        return {"controller": dict(overrides.get("controller", {})), "rules": dict(overrides.get("rules", {})),
                LEARNING_TABLE: dict(overrides.get(LEARNING_TABLE, {}))}
    return {"controller": {}, "rules": dict(overrides), LEARNING_TABLE: {}}


def _line_of(text: Optional[str], table: str, key: Optional[str] = None) -> str:
    """' (line N)' of ``[table]`` (or of ``key =`` inside it) in the file text, '' if not found."""
    if not text:
        return ""
    lines = text.splitlines()
    header = re.compile(r"^\s*\[\s*" + re.escape(table).replace(r"\.", r"\s*\.\s*") + r"\s*\]")
    for i, line in enumerate(lines):
        if header.match(line):
            if key is None:
                return f" (line {i + 1})"
            for j in range(i + 1, len(lines)):
                if lines[j].lstrip().startswith("["):
                    break
                if re.match(r"^\s*" + re.escape(key) + r"\s*=", lines[j]):
                    return f" (line {j + 1})"
            return f" (line {i + 1})"
    return ""


def _merge(base: dict[str, Any], extra: Mapping[str, Any], source: str, text: Optional[str]) -> None:
    base.setdefault(LEARNING_TABLE, {}).update(extra.get(LEARNING_TABLE, {}))  # its keys are checked by _build
    for key, value in extra.get("controller", {}).items():
        if key not in base["controller"]:
            raise RulesError(f"{source}{_line_of(text, 'controller', key)}: [controller] has no key {key!r}; "
                             f"known: {', '.join(sorted(base['controller']))}")
        base["controller"][key] = value
    for name, values in extra.get("rules", {}).items():
        if not isinstance(values, Mapping):
            raise RulesError(f"{source}{_line_of(text, 'rules.' + str(name))}: rules.{name} must be a table")
        if name not in base["rules"] and "scope" in values:  # a rule of its own (checked whole by _build)
            base["rules"][name] = {}
        if name not in base["rules"]:
            raise RulesError(f"{source}{_line_of(text, 'rules.' + str(name))}: unknown rule {name!r}; "
                             f"known: {', '.join(sorted(base['rules']))}")
        allowed = {f.name for f in fields(Rule)} - {"name"}
        for key, value in values.items():
            if key not in allowed:
                raise RulesError(f"{source}{_line_of(text, 'rules.' + name, key)}: rule {name!r} has no key {key!r}; "
                                 f"known: {', '.join(sorted(allowed))}")
            base["rules"][name][key] = value


def _number(value: Any, where: str, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RulesError(f"{where}: expected a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise RulesError(f"{where}: expected a whole number, got {value!r}")
    return int(value) if integer else float(value)


# Controller keys with a range narrower than "≥ 0": the key, its test, what it must be (and why), for the error.
_CONTROLLER_RANGES = (
    ("keep_unproven_likely_pct", lambda v: 50.0 <= v <= 100.0,
     "within [50, 100] (a probability that a move is not lower, in %)"),
    ("drift_confidence_pct", lambda v: 50.0 <= v < 100.0,
     "within [50, 100) (how sure a slowdown of the known setting must be, in %)"),
    ("stale_after_intervals", lambda v: v >= 1, "≥ 1 (a sample is at most one interval old while its agent runs)"),
    ("lone_period_x", lambda v: not 0 < v <= 1, "0 (off) or above 1 (times the median period)"),
    ("periodic_heavy_x", lambda v: not 0 < v <= 1, "0 (off) or above 1 (times the neighbouring steps' median)"),
    ("periodic_min_repeats", lambda v: v >= 2, "≥ 2 (one heavy step has no spacing to recur at)"),
    ("persistence_max", lambda v: v < 1, "below 1 (at 1 a window's mean would carry no information)"),
    ("plan_retry_min_s", lambda v: v > 0, "above 0 (a failing job would be planned again at once, in a loop)"),
)


def _build(data: Mapping[str, Any], source: str, text: Optional[str]) -> RuleSet:
    ctl_in = data.get("controller", {})
    ctl = {}
    for f in fields(ControllerSettings):
        where = f"{source}{_line_of(text, 'controller', f.name)}: controller.{f.name}"
        if f.type in ("str", "bool"):  # a name (the period and queue knobs), or a switch
            value = ctl_in.get(f.name, f.default)
            if not isinstance(value, str if f.type == "str" else bool):
                raise RulesError(f"{where}: expected {'text' if f.type == 'str' else 'true or false'}, got {value!r}")
            ctl[f.name] = value
            continue
        value = _number(ctl_in.get(f.name, f.default), where, integer=f.type == "int")
        if value < 0:
            raise RulesError(f"{where}: must be ≥ 0, got {value}")
        ctl[f.name] = value
    if ctl["window_min_steps"] < 1 or ctl["window_max_steps"] < ctl["window_min_steps"]:
        raise RulesError(f"{source}: controller needs 1 ≤ window_min_steps ≤ window_max_steps")
    for key, ok, must in _CONTROLLER_RANGES:
        if not ok(ctl[key]):
            raise RulesError(f"{source}{_line_of(text, 'controller', key)}: controller.{key}: must be {must}, "
                             f"got {ctl[key]:g}")
    if not ctl["end_state_util_low_pct"] <= ctl["end_state_util_high_pct"] <= 100.0:
        raise RulesError(f"{source}: controller needs end_state_util_low_pct ≤ end_state_util_high_pct ≤ 100")
    if ctl["end_state_window_s"] <= 0:
        raise RulesError(f"{source}: controller.end_state_window_s must be above 0")
    if ctl["plan_retry_max_s"] < ctl["plan_retry_min_s"]:
        raise RulesError(f"{source}: controller needs plan_retry_min_s ≤ plan_retry_max_s")
    if ctl["window_enough_steps"] < ctl["window_min_steps"] or ctl["verdict_enough_steps"] < ctl["window_min_steps"]:
        raise RulesError(f"{source}: controller needs window_enough_steps and verdict_enough_steps ≥ window_min_steps")
    if ctl["steps_read_max"] < 2 * ctl["window_enough_steps"]:
        raise RulesError(f"{source}: controller needs steps_read_max ≥ 2 × window_enough_steps (a change's windows "
                         f"before and after it)")
    rules = []
    for name, d in data.get("rules", {}).items():
        def where(key: Optional[str] = None) -> str:
            return f"{source}{_line_of(text, 'rules.' + name, key)}: rules.{name}" + (f".{key}" if key else "")

        missing = [k for k in ("priority", "scope", "signal", "healthy_below", "act_above", "actions", "advice")
                   if k not in d]
        if missing:
            raise RulesError(f"{where()}: missing {', '.join(missing)}")
        if d["scope"] not in SCOPES:
            raise RulesError(f"{where('scope')}: must be one of {SCOPES}, got {d['scope']!r}")
        if d["signal"] not in KNOWN_SIGNALS:
            raise RulesError(f"{where('signal')}: unknown signal {d['signal']!r}; known: {', '.join(sorted(KNOWN_SIGNALS))}")
        healthy, act = _number(d["healthy_below"], where("healthy_below")), _number(d["act_above"], where("act_above"))
        if healthy > act and d["signal"] != "ooms":
            raise RulesError(f"{where('healthy_below')}: healthy_below ({healthy}) is above act_above ({act})")
        if not isinstance(d["actions"], Sequence) or isinstance(d["actions"], str):
            raise RulesError(f"{where('actions')}: must be a list of {{knob, op, by}} tables")
        actions = []
        for i, a in enumerate(d["actions"]):
            w = f"{where('actions')}[{i}]"
            if not isinstance(a, Mapping) or not {"knob", "op", "by"} <= set(a) \
                    or set(a) - {"knob", "op", "by", "needs_memory_headroom", "strong_by", "to_memory_fit"}:
                raise RulesError(f"{w}: needs exactly knob, op, by (and optionally needs_memory_headroom, strong_by, "
                                 f"to_memory_fit), got {a!r}")
            if a["op"] not in OPS:
                raise RulesError(f"{w}: op must be one of {tuple(OPS)}, got {a['op']!r}")
            by = _number(a["by"], f"{w}.by")
            if (a["op"] in ("mul", "div") and by <= 0) or (a["op"] == "add" and by == 0) or by == 1 and a["op"] != "add":
                raise RulesError(f"{w}: by={by} would not change the knob")
            if not isinstance(a["knob"], str) or not a["knob"]:
                raise RulesError(f"{w}: knob must be a knob name")
            strong_by = None if a.get("strong_by") is None else _number(a["strong_by"], f"{w}.strong_by")
            if strong_by is not None and Action(a["knob"], a["op"], strong_by).direction != \
                    Action(a["knob"], a["op"], by).direction:
                raise RulesError(f"{w}: strong_by={strong_by} moves the knob the other way than by={by}")
            action = Action(a["knob"], a["op"], by, bool(a.get("needs_memory_headroom", False)), strong_by,
                            bool(a.get("to_memory_fit", False)))
            if action.to_memory_fit and action.direction > 0:
                raise RulesError(f"{w}: to_memory_fit lowers a knob to what the memory forecast says fits: its op "
                                 f"and by must lower it")
            actions.append(action)
        if d.get("follow_above") is not None and _number(d["follow_above"], where("follow_above")) >= act:
            raise RulesError(f"{where('follow_above')}: follow_above ({d['follow_above']}) must be below act_above "
                             f"({act}): it is the line a rule follows a gain down to, under the one it acts at")
        for key, kind, must in (("advice", str, "text"), ("unit", str, "text"), ("safety", bool, "true or false"),
                                ("placement_advice", bool, "true or false")):
            if not isinstance(d.get(key, kind()), kind):
                raise RulesError(f"{where(key)}: must be {must}")
        rules.append(Rule(name=name, priority=int(_number(d["priority"], where("priority"), integer=True)),
                          scope=d["scope"], signal=d["signal"], unit=d.get("unit", ""), healthy_below=healthy,
                          act_above=act, actions=tuple(actions), advice=d["advice"], safety=d.get("safety", False),
                          placement_advice=d.get("placement_advice", False), gpu_signal=d.get("gpu_signal"),
                          fallback_gpu_signal=d.get("fallback_gpu_signal"),
                          strong_above=None if d.get("strong_above") is None
                          else _number(d["strong_above"], where("strong_above")),
                          follow_above=None if d.get("follow_above") is None
                          else _number(d["follow_above"], where("follow_above"))))
    rules.sort(key=lambda r: (r.priority, r.name))
    try:
        learning = build_learning(data.get(LEARNING_TABLE), f"{source}{_line_of(text, LEARNING_TABLE)}")
    except LearningRulesError as exc:
        raise RulesError(str(exc)) from None
    return RuleSet(ControllerSettings(**ctl), tuple(rules), learning)


def _parse(text: str, source: str) -> dict[str, Any]:
    from trimtab.config import ConfigError, parse_toml

    try:
        return parse_toml(text, source)
    except ConfigError as exc:  # "source: reason (at line N, column M)"
        raise RulesError(str(exc)) from None


def shipped_text() -> str:
    return resources.files("trimtab.grading").joinpath(SHIPPED).read_text(encoding="utf-8")


def load_rules(path: Optional[str | Path] = None, overrides: Optional[Mapping[str, Any]] = None,
               overrides_source: str = "trimtab.toml") -> RuleSet:
    """The shipped rules, then ``path`` (a rules file: only the keys it names change), then ``overrides``
    (``{"controller": …, "rules": …}`` from trimtab.toml). Raises :class:`RulesError` with file, line and reason."""
    data = _parse(shipped_text(), SHIPPED)
    if path is not None:
        from trimtab.config import ConfigError, read_toml_text

        p = Path(path)
        try:
            text = read_toml_text(p)
        except ConfigError as exc:
            raise RulesError(str(exc)) from None
        doc = _parse(text, str(p))
        _merge(data, _normalise(doc), str(p), text)
        rs = _build(data, str(p), text)
    else:
        rs = _build(data, SHIPPED, None)
    if overrides:
        data = _as_document(rs)
        _merge(data, _normalise(overrides), overrides_source, None)
        rs = _build(data, overrides_source, None)
    return rs


def default_rules() -> RuleSet:
    return load_rules()


def check_job_overrides(rules: RuleSet, overrides: Mapping[str, Any]) -> None:
    """Raise :class:`RulesError` unless ``overrides`` (a job's registration "rules") apply cleanly."""
    rules.with_overrides(overrides)


def thresholds(rules: RuleSet) -> dict[str, dict[str, Any]]:
    """The GPU-scope rules' lines and advice by rule name (what a node's check rows are graded by)."""
    return {r.name: dict(healthy_below=r.healthy_below, act_above=r.act_above, advice=r.advice,
                         **({"signal": r.gpu_signal or "sm_active_pct", "fallback_signal": r.fallback_gpu_signal
                             or "util_pct"} if r.signal == "utilization_spread_pts" else {}))
            for r in rules.rules if r.scope == "gpu"}


__all__ = ["Action", "ControllerSettings", "Rule", "RuleSet", "RulesError", "check_job_overrides", "default_rules",
           "load_rules", "thresholds"]
