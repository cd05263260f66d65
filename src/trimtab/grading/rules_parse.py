"""Reading and checking the rules file: the shipped ``rules.toml``, then a rules file, then overrides (trimtab.toml's
or a job's), each merged as a document and checked whole.

Loading checks everything once, at start, so a typo never silently does nothing: an unknown rule or key, a value of
the wrong type, healthy above act, an unknown knob operation — each is a :class:`RulesError` naming the file, the
line and the reason. What comes out is the typed parts of :mod:`trimtab.grading.rule_types`, which
:class:`trimtab.grading.rules.RuleSet` holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from trimtab.grading.learning_rules import LEARNING_TABLE, LearningRulesError, LearningSettings, build as build_learning
from trimtab.grading.rule_types import OPS, Action, ControllerSettings, Rule

SHIPPED = "rules.toml"
SCOPES = ("job", "gpu")
KNOWN_SIGNALS = {
    "ooms", "mem_used_pct", "fragmentation_pct", "collective_latency_x_baseline", "pcie_pct_of_peak",
    "communication_share_pct", "generation_share_pct", "evaluation_share_pct", "wait_share_pct", "update_share_pct",
    "utilization_spread_pts", "memory_forecast_pct",
}


class RulesError(ValueError):
    """A rules file or override cannot be used; the message says where and why."""


class RuleParts(NamedTuple):
    """What a checked rules document holds, in the order :class:`trimtab.grading.rules.RuleSet` takes it."""
    controller: ControllerSettings
    rules: tuple[Rule, ...]  # by priority
    learning: LearningSettings


def _as_document(rs: RuleParts) -> dict[str, Any]:
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


def _build(data: Mapping[str, Any], source: str, text: Optional[str]) -> RuleParts:
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
    return RuleParts(ControllerSettings(**ctl), tuple(rules), learning)


def _parse(text: str, source: str) -> dict[str, Any]:
    from trimtab.config import ConfigError, parse_toml

    try:
        return parse_toml(text, source)
    except ConfigError as exc:  # "source: reason (at line N, column M)"
        raise RulesError(str(exc)) from None


def shipped_text() -> str:
    return resources.files("trimtab.grading").joinpath(SHIPPED).read_text(encoding="utf-8")


def read_rules(path: Optional[str | Path] = None, overrides: Optional[Mapping[str, Any]] = None,
               overrides_source: str = "trimtab.toml") -> RuleParts:
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
    return apply_overrides(rs, overrides, overrides_source)


def apply_overrides(parts: RuleParts, overrides: Optional[Mapping[str, Any]], source: str) -> RuleParts:
    """``parts`` with ``{"controller": {...}, "rules": {name: {...}}}`` (or ``{name: {...}}``) applied and the
    result checked whole; ``parts`` itself when there is nothing to apply."""
    if not overrides:
        return parts
    data = _as_document(parts)
    _merge(data, _normalise(overrides), source, text=None)
    return _build(data, source, text=None)
