"""Which knobs change what is learned, and how far a learning signal may move before a change to one is undone
(issue 41): the ``[learning]`` table of the rules, as data.

Raising the staleness bound (``prefetch``; verl's ``async_training.staleness_threshold``) or syncing weights less
often (``sync_every``; verl's ``trigger_parameter_sync_step``) buys samples per second by training on older data: such
a change is kept only if learning keeps up (:mod:`trimtab.control.goodput`). Micro-batch sizes and token budgets
change memory and speed, never the maths. Any other knob — ``batch_size`` in a plain loop — is the job's to declare:
its registration's rules override lists it in ``changes_learning``. The other way round, a job that knows a knob
changes only its speed in its own setting (a simulated job, a queue whose trainer never sees a sample older than the
last sync) lists it in ``throughput_only``: such a knob is judged on samples/s, never on learning, and never made
advice-only for want of a learning signal.

A job that reports no learning signal cannot have a change to a learning knob judged on learning: with
``without_signals = "advise"`` (shipped) such a change is advice, not made, and ``check`` and ``GET /v1/jobs/{name}``
say why (:func:`advised_only`); ``"throughput"`` judges it on samples/s alone, as before learning signals existed.

Guards compare the after window's mean of a signal with the before window's, each over at least
``guard_min_steps`` steps that report it: an absolute rise (clip fraction, stale share), a ratio (KL and gradient
norm, above a floor so a KL of 1e-5 doubling is no alarm) or an absolute drop (effective sample size).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Optional

LEARNING_TABLE = "learning"
WITHOUT_SIGNALS = ("advise", "throughput")


class LearningRulesError(ValueError):
    """A ``[learning]`` table that cannot be used (the rules' loader words it with file and line)."""


@dataclass(frozen=True)
class LearningSettings:
    changes_learning: tuple[str, ...] = ("prefetch", "sync_every")
    without_signals: str = "advise"  # a learning knob of a job reporting no signal: "advise" or "throughput"
    never_changes_learning: tuple[str, ...] = ("*micro_batch*", "*_max_tokens")
    throughput_only: tuple[str, ...] = ()  # knobs the job declares change only its speed (overrides the above)
    guard_min_steps: int = 4
    clip_fraction_max_rise: float = 0.05
    stale_share_max_rise: float = 1.0  # the share alone never rolls back by default (rules.toml says why)
    eff_sample_size_max_drop: float = 0.10
    kl_max_x: float = 2.0
    kl_floor: float = 0.01
    grad_norm_max_x: float = 3.0
    grad_norm_floor: float = 0.01
    reward_rate_confidence_pct: float = 95.0
    reward_min_steps: int = 8

    def changes_learning_of(self, knob: str) -> Optional[bool]:
        """True: a change to ``knob`` changes what is learned; False: it never does (memory and speed only);
        None: nobody said (a plain loop's ``batch_size`` until the job declares it). A knob the job declares
        ``throughput_only`` never does, whatever the shipped lists say."""
        if knob in self.throughput_only:
            return False
        if knob in self.changes_learning:
            return True
        if any(fnmatch.fnmatchcase(knob, pattern) for pattern in self.never_changes_learning):
            return False
        return None

    def learning_knobs(self, knobs: Iterable[str]) -> list[str]:
        """The knobs of ``knobs`` a change to which changes what is learned, sorted."""
        return sorted(k for k in knobs if self.changes_learning_of(k) is True)

    def to_document(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


NO_SIGNAL = "no learning signal reported"


def advised_only(cfg: LearningSettings, knobs: Iterable[str], reports_learning: bool) -> Optional[str]:
    """Why changes to some of a job's ``knobs`` stay advice: they change what is learned, the job reports no
    learning signal (``reports_learning`` False) and the rules say ``without_signals = "advise"`` — "no learning
    signal reported: advising only on prefetch, sync_every". None when every change may be made."""
    if cfg.without_signals != "advise" or reports_learning:
        return None
    advised = cfg.learning_knobs(knobs)
    return f"{NO_SIGNAL}: advising only on {', '.join(advised)}" if advised else None


def build(table: Optional[Mapping[str, Any]], where: str) -> LearningSettings:
    """The settings from a ``[learning]`` table (keys it leaves out keep their defaults)."""
    table = dict(table or {})
    defaults = LearningSettings()
    known = {f.name for f in fields(LearningSettings)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise LearningRulesError(f"{where}: [learning] has no key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    out: dict[str, Any] = {}
    for f in fields(LearningSettings):
        value = table.get(f.name, getattr(defaults, f.name))
        if f.name == "without_signals":
            if value not in WITHOUT_SIGNALS:
                raise LearningRulesError(f"{where}: learning.without_signals: must be one of {WITHOUT_SIGNALS}, got "
                                         f"{value!r}")
            out[f.name] = value
            continue
        if isinstance(getattr(defaults, f.name), tuple):
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise LearningRulesError(f"{where}: learning.{f.name}: expected a list of knob names, got {value!r}")
            out[f.name] = tuple(value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise LearningRulesError(f"{where}: learning.{f.name}: expected a number ≥ 0, got {value!r}")
        if isinstance(getattr(defaults, f.name), int) and not float(value).is_integer():
            raise LearningRulesError(f"{where}: learning.{f.name}: expected a whole number, got {value!r}")
        out[f.name] = type(getattr(defaults, f.name))(value)
    if not 50.0 <= out["reward_rate_confidence_pct"] < 100.0:
        raise LearningRulesError(f"{where}: learning.reward_rate_confidence_pct: must be within [50, 100)")
    both = set(out["changes_learning"]) & {k for k in out["changes_learning"]
                                           if any(fnmatch.fnmatchcase(k, p) for p in out["never_changes_learning"])}
    if both:
        raise LearningRulesError(f"{where}: learning: {sorted(both)[0]!r} is both in changes_learning and matched "
                                 f"by never_changes_learning")
    return LearningSettings(**out)
