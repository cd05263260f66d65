"""The rules the controller and the balance checks grade by: a :class:`RuleSet` (the controller's settings, the
rules by priority, what changes learning), loaded from ``rules.toml`` with overrides.

The reading and every check on a rules file are :mod:`trimtab.grading.rules_parse`; a rule's parts are
:mod:`trimtab.grading.rule_types` (``Action``, ``ControllerSettings`` and ``Rule`` are importable from here too, as
``trimtab.control`` imports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from trimtab.grading.learning_rules import LearningSettings
from trimtab.grading.rule_types import Action, ControllerSettings, Rule
from trimtab.grading.rules_parse import RuleParts, apply_overrides, read_rules


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
        return RuleSet(*apply_overrides(RuleParts(self.controller, self.rules, self.learning), overrides, source))


def load_rules(path: Optional[str | Path] = None, overrides: Optional[Mapping[str, Any]] = None,
               overrides_source: str = "trimtab.toml") -> RuleSet:
    """The shipped rules, then ``path`` (a rules file: only the keys it names change), then ``overrides``
    (``{"controller": …, "rules": …}`` from trimtab.toml). Raises :class:`~trimtab.grading.rules_parse.RulesError`
    with file, line and reason."""
    return RuleSet(*read_rules(path, overrides, overrides_source))


def default_rules() -> RuleSet:
    return load_rules()


def check_job_overrides(rules: RuleSet, overrides: Mapping[str, Any]) -> None:
    """Raise :class:`~trimtab.grading.rules_parse.RulesError` unless ``overrides`` (a job's registration "rules")
    apply cleanly."""
    rules.with_overrides(overrides)


def thresholds(rules: RuleSet) -> dict[str, dict[str, Any]]:
    """The GPU-scope rules' lines and advice by rule name (what a node's check rows are graded by)."""
    return {r.name: dict(healthy_below=r.healthy_below, act_above=r.act_above, advice=r.advice,
                         **({"signal": r.gpu_signal or "sm_active_pct", "fallback_signal": r.fallback_gpu_signal
                             or "util_pct"} if r.signal == "utilization_spread_pts" else {}))
            for r in rules.rules if r.scope == "gpu"}


__all__ = ["Action", "ControllerSettings", "Rule", "RuleSet", "check_job_overrides", "default_rules", "load_rules",
           "thresholds"]
