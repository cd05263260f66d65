"""The per-job controller: from what the store holds about a job (its steps, changes, decisions, GPU samples), what
to do now — nothing, follow up the change in flight (keep it or roll it back), queue one new change, or record
advice.

``plan()`` is pure: it reads a :class:`JobState` and returns a :class:`Plan`, so every rule, the hysteresis, the
cooldown, the bounds, the OOM ceiling, the rollback and the priority are tested on recorded windows without a
server. The state lives only in the store (one pending decision at most per job, its change, the acks), so a
restarted daemon picks up a change in flight where it was and never queues it twice.

Order of business (DESIGN.md "Knobs", issue 5):
1. mode ``off`` → nothing.
2. A decision still pending → if the job refused its change, close it "refused" (never kept; that direction is not
   asked again within the retry time); else wait for the job to apply its change, then measure an equal window after it (past
   the settle steps) and compare throughput: fell by more than the dead band → queue the old value back
   ("rolled_back"), else "kept" (within the dead band it is kept but marked no-gain, and that move is not retried).
3. Any other change pending (an admin's, a rollback) → wait.
4. A window of steps after the last applied change (+ settle + cooldown) → grade every rule on it; the first rule
   (by priority) that fires and has an action it may take acts (``auto``) or advises (``advise``). A safety rule
   that fires and cannot act stops lower rules: speed never goes before memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from trimtab.rebalancer.balance import GpuWindow
from trimtab.rebalancer.memory_fit import GIB, fit
from trimtab.rebalancer.rules import Action, Rule, RuleSet
from trimtab.rebalancer.signals import JobContext, Reading, alloc_retries, gpu_reading, job_reading
from trimtab.rebalancer.verdict import GAIN, INCONCLUSIVE, WORSE, Sample, changed_level, compare
from trimtab.rebalancer.window import JobStep, chunk_rates, throughput, window
from trimtab.store.decisions import StoredDecision
from trimtab.store.jobs import StoredChange, StoredJob, number

GpuFetch = Callable[[int, int], Sequence[GpuWindow]]  # (start_ms, end_ms) → the job's GPUs' window aggregates


@dataclass(frozen=True)
class JobState:
    job: StoredJob
    steps: Sequence[JobStep]                 # complete steps, oldest first
    changes: Sequence[StoredChange]          # newest first
    decisions: Sequence[StoredDecision]      # newest first (recent ones suffice)
    gpus: GpuFetch
    probe_baseline_us: Optional[float]
    now_ms: int
    has_gpus: bool                           # the job declared GPUs (a CPU job has no GPU memory to protect)


@dataclass
class NewChange:
    rule: str
    knob: str
    old_value: float
    new_value: float
    reason: str


@dataclass
class Plan:
    """What to do; at most one of ``change`` / ``advice_rule`` / ``close`` is set."""
    note: str                                          # why, for logs and /healthz
    change: Optional[NewChange] = None                 # queue it (auto) with a pending decision
    advised: Optional[NewChange] = None                # advise mode: the change it would make
    advice_rule: Optional[str] = None                  # record an advice-only decision for this rule
    advice: Optional[str] = None
    evidence: dict[str, Any] = field(default_factory=dict)
    throughput_before: Optional[float] = None
    close: Optional[int] = None                        # decision id to close …
    outcome: Optional[str] = None                      # … with this outcome
    throughput_after: Optional[float] = None
    rollback_to: Optional[float] = None                # queue the knob back to this value
    rollback_knob: Optional[str] = None
    applied_step: Optional[int] = None                 # the change's step, for the decision row
    measuring: Optional[int] = None                    # decision id being measured (its step is known now)
    readings: list[Reading] = field(default_factory=list)


def _integer_knob(spec: dict) -> bool:
    return all(float(spec[k]).is_integer() for k in ("value", "min", "max"))


def _next_value(action: Action, spec: dict, strong: bool = False) -> float:
    current = float(spec["value"])
    new = action.apply(current, strong)
    if _integer_knob(spec):
        new = math.ceil(new - 1e-9) if action.direction > 0 else math.floor(new + 1e-9)
        new = max(new, current + 1) if action.direction > 0 else min(new, current - 1)
    return max(float(spec["min"]), min(float(spec["max"]), new))


def _recent(decisions: Sequence[StoredDecision], now_ms: int, within_s: float) -> list[StoredDecision]:
    return [d for d in decisions if now_ms - d.ts_ms <= within_s * 1000]


def _verdict_ms(d: StoredDecision) -> int:
    return d.evidence.get("verdict_ms", d.ts_ms) if isinstance(d.evidence, dict) else d.ts_ms


def _still_holds(state: JobState, rules: RuleSet, d: StoredDecision, now: Optional[Sample]) -> bool:
    """A measured verdict (rolled back, no gain) still describes the job: its throughput at the setting the verdict
    left it in has not moved measurably since (else — a slowdown that began with the change, another knob moved,
    a new phase of training — it is re-measured: the move may be tried again)."""
    ev = d.evidence if isinstance(d.evidence, dict) else {}
    level = ev.get("before_sample") if d.outcome == "rolled_back" else ev.get("after_sample")
    return not changed_level(Sample.from_evidence(level), now, rules.controller)


def _blocked(state: JobState, rules: RuleSet, action: Action, new: float, now: Optional[Sample]) -> Optional[str]:
    """Why this move may not be tried now (a rolled-back value or a no-gain direction whose verdict still holds, a
    recently refused direction), else None."""
    for d in state.decisions:
        if d.knob != action.knob or d.new_value is None or d.old_value is None:
            continue
        same_way = (d.new_value - d.old_value) * action.direction > 0
        if d.outcome == "refused" and same_way:
            if state.now_ms - _verdict_ms(d) > rules.controller.retry_after_s * 1000:
                continue  # the clock runs from the verdict, not from when the change was decided
            # The job's knob owner said no; asking again the same way would only be refused again.
            reason = d.evidence.get("refused_reason") if isinstance(d.evidence, dict) else None
            return f"the job refused {action.knob} → {d.new_value:g} at decision {d.id} ({reason or 'no reason'})"
        if d.outcome == "rolled_back" and float(d.new_value) == new and _still_holds(state, rules, d, now):
            return f"{action.knob}={new:g} was rolled back at decision {d.id}"
        if d.outcome == "kept" and d.evidence.get("no_gain") and same_way \
                and d.new_value == state.job.knobs[action.knob]["value"] and _still_holds(state, rules, d, now):
            return f"the last {action.describe()} (decision {d.id}) gained nothing measurable"
    return None


def _bracket(state: JobState, rules: RuleSet, action: Action, spec: dict, new: float,
             now: Optional[Sample]) -> tuple[Optional[float], Optional[str]]:
    """After an overshoot that was rolled back, the next move goes between the current value and the failed one
    (the geometric middle for ×/÷ steps, the arithmetic one for +), until they are closer than
    ``bracket_min_gap_pct``. (new, note) — new None when nothing is left between them."""
    current = float(spec["value"])
    failed = [d for d in state.decisions if d.outcome == "rolled_back" and d.knob == action.knob
              and d.new_value is not None and (float(d.new_value) - current) * action.direction > 0
              and _still_holds(state, rules, d, now)]
    if not failed:
        return new, None
    nearest = min(failed, key=lambda d: abs(float(d.new_value) - current))
    bad = float(nearest.new_value)
    if (new - bad) * action.direction < 0:
        return new, None  # the step stays short of the value that failed
    where = f"between {current:g} and {bad:g} (rolled back at decision {nearest.id})"
    if current > 0 and abs(bad / current - 1.0) * 100.0 < rules.controller.bracket_min_gap_pct:
        return None, f"{where}: closer than {rules.controller.bracket_min_gap_pct:g} %, nothing left to try"
    mid = math.sqrt(current * bad) if action.op != "add" and current > 0 else (current + bad) / 2.0
    if _integer_knob(spec):
        mid = float(round(mid))
    if not min(current, bad) < mid < max(current, bad):
        return None, f"{where}: no value left between them"
    return mid, f"bracket search {where}: {mid:g}"


def _headroom(state: JobState, rules: RuleSet, readings: dict[str, Reading]) -> Optional[str]:
    """None when a batch-size raise is safe, else why not."""
    ctl = rules.controller
    mem = next((r for r in readings.values() if r.signal == "mem_used_pct"), None)
    if state.has_gpus:
        if mem is None or mem.value is None:
            return "GPU memory of the job's GPUs is unknown (no agent samples)"
        if mem.value > ctl.raise_batch_max_mem_pct:
            return f"GPU memory at {mem.value:.1f} % (raising needs < {ctl.raise_batch_max_mem_pct:g} %)"
    frag = next((r for r in readings.values() if r.signal == "fragmentation_pct"), None)
    if frag is not None and frag.value is not None and frag.value > ctl.raise_batch_max_fragmentation_pct:
        return f"fragmentation at {frag.value:.1f} % (raising needs < {ctl.raise_batch_max_fragmentation_pct:g} %)"
    return None


def _strong(rule: Rule, reading: Reading) -> bool:
    """The signal is far above its line (over the whole window and each half): the rule's larger step."""
    if rule.strong_above is None or reading.value is None or reading.value <= rule.strong_above:
        return False
    return all(h is None or h > rule.strong_above for h in reading.detail.get("halves", []))


def _choose(rule: Rule, state: JobState, rules: RuleSet, readings: dict[str, Reading],
            now: Optional[Sample] = None) -> tuple[Optional[tuple[Action, float]], list[str], list[str]]:
    """The first action of the rule that may act, with its new value; the actions skipped and why; how the step
    was chosen (strong evidence, bracket search, memory prediction)."""
    skipped: list[str] = []
    # A rule lists actions for several kinds of job (one batch size, or a framework's per-call micro-batches);
    # the knobs a job did not declare are worth naming only when it declared none of them.
    declared_any = any(a.knob in state.job.knobs for a in rule.actions)
    strong = _strong(rule, readings[rule.name])
    for action in rule.actions:
        spec = state.job.knobs.get(action.knob)
        if spec is None:
            if not declared_any:
                skipped.append(f"{action.describe()}: the job declared no knob {action.knob!r}")
            continue
        policy = []
        new = _next_value(action, spec, strong)
        if strong and action.strong_by is not None and new != float(spec["value"]):
            policy.append(f"strong evidence ({readings[rule.name].value:.1f} > {rule.strong_above:g} over the "
                          f"window and each half): step {action.strong_by:g} instead of {action.by:g}")
        if new == float(spec["value"]):
            bound = "max" if action.direction > 0 else "min"
            skipped.append(f"{action.describe()}: {action.knob} is at its {bound} ({spec[bound]:g})")
            continue
        bracketed, note = _bracket(state, rules, action, spec, new, now)
        if note is not None:
            policy.append(note)
        if bracketed is None:
            skipped.append(f"{action.describe()}: {note}")
            continue
        new = bracketed
        why = _blocked(state, rules, action, new, now)
        if why is None and action.needs_memory_headroom and action.direction > 0:
            why = _headroom(state, rules, readings)
            if why is None:
                new, why = _memory_step(state, rules, action, spec, new, policy)
        if why is not None:
            skipped.append(f"{action.describe()}: {why}")
            continue
        return (action, new), skipped, policy
    return None, skipped, []


def _memory_step(state: JobState, rules: RuleSet, action: Action, spec: dict, new: float,
                 policy: list) -> tuple[float, Optional[str]]:
    """The raise cut to the largest value whose predicted memory stays under the line (the prediction goes into
    the policy notes and, as a dict, into the decision's evidence); why not, when not even one step fits."""
    current = float(spec["value"])
    mfit = fit(state.steps, state.changes, action.knob, current, rules.controller)
    if mfit is None:
        return new, None  # no allocator peaks or capacity reported: today's headroom check alone
    largest = mfit.largest_fitting()
    if largest <= current:
        nxt = current + 1
        return new, (f"memory predicted at {action.knob}={nxt:g}: {mfit.predict(nxt) / GIB:.1f} GiB + margin "
                     f"{mfit.margin_bytes / GIB:.1f} GiB, above the line ({mfit.line_bytes / GIB:.1f} GiB)")
    if new > largest:
        policy.append(f"memory: {action.knob}={new:g} would need {mfit.predict(new) / GIB:.1f} GiB (line "
                      f"{mfit.line_bytes / GIB:.1f} GiB less {mfit.margin_bytes / GIB:.1f} GiB margin): "
                      f"{largest:g} fits")
        new = float(largest)
    policy.append({"memory_prediction": mfit.evidence(new)})
    return new, None


def _window_evidence(steps: Sequence[JobStep]) -> dict[str, Any]:
    tp = throughput(steps)
    return {"steps": [steps[0].step, steps[-1].step], "n_steps": len(steps),
            "seconds": round(sum(s.step_time_s for s in steps), 3),
            "samples_per_s": None if tp is None else round(tp, 3)}


def period(job: StoredJob, rules: RuleSet) -> int:
    """Steps per sync period (the period knob's value; 1 when the job has no such knob)."""
    spec = job.knobs.get(rules.controller.period_knob)
    try:
        return max(1, int(round(float(spec["value"])))) if spec else 1
    except (TypeError, ValueError, KeyError):
        return 1


def _leading(steps: Sequence[JobStep], min_steps: int, min_s: float, every: int) -> tuple[list[JobStep], bool]:
    """The oldest steps of ``steps`` covering ``min_s`` seconds and ``min_steps`` steps in whole periods of
    ``every`` steps, and True; or all whole periods there are so far, and False."""
    every = max(1, every)
    total_s = 0.0
    for i, step in enumerate(steps):
        total_s += step.step_time_s
        n = i + 1
        if n % every == 0 and n >= min_steps and total_s >= min_s:
            return list(steps[:n]), True
    return list(steps[:len(steps) - len(steps) % every]), False


def _before_steps(state: JobState, rules: RuleSet, change: StoredChange) -> list[JobStep]:
    """The steps before a change at the setting it changed: after the previous change's settle steps, the newest
    covering ``verdict_before_s`` (in whole periods of the old sync interval)."""
    ctl = rules.controller
    earlier = [c.applied_step for c in state.changes if c.status == "applied" and c.applied_step is not None
               and c.applied_step < change.applied_step]
    start = max(earlier) + ctl.settle_steps if earlier else 0
    every = period(state.job, rules)
    if change.knob == ctl.period_knob and change.previous_value:
        every = max(1, int(round(float(change.previous_value))))
    candidates = [s for s in state.steps if start <= s.step < change.applied_step]
    newest_first, _ = _leading(candidates[::-1], ctl.window_min_steps, ctl.verdict_before_s, every)
    return newest_first[::-1]


def _last_applied_step(state: JobState) -> Optional[int]:
    steps = [c.applied_step for c in state.changes if c.status == "applied" and c.applied_step is not None]
    return max(steps) if steps else None


def _gate_fragmentation(readings: dict[str, Reading], rules: RuleSet, retries: int) -> None:
    """Fragmentation is a problem only under memory pressure: a fragmented cache on a GPU with room to spare
    costs nothing. Without pressure (GPU memory below the memory rule's healthy line and no allocator retries in
    the window) a firing fragmentation reading is downgraded to "watch"."""
    frag = next((r for r in readings.values() if r.signal == "fragmentation_pct" and r.fires), None)
    if frag is None:
        return
    memory_rule = next((r for r in rules.rules if r.signal == "mem_used_pct"), None)
    mem = next((r for r in readings.values() if r.signal == "mem_used_pct"), None)
    pressed = retries > 0 or (mem is not None and mem.value is not None and memory_rule is not None
                              and mem.value >= memory_rule.healthy_below)
    frag.detail["alloc_retries_in_window"] = retries
    if not pressed:
        frag.status = "watch"
        mem_txt = "unknown" if mem is None or mem.value is None else f"{mem.value:.1f} %"
        frag.message += f"; no memory pressure (GPU memory {mem_txt}, no allocator retries): not acting"


def readings_for(state: JobState, rules: RuleSet, win: Sequence[JobStep]) -> dict[str, Reading]:
    # OOMs count from the last change's step (its settle step is left out of the window), minus those an "oom"
    # decision already reported: an OOM is advised once, not in every later window.
    advised = [d.evidence.get("reading", {}).get("num_ooms_cumulative") for d in state.decisions
               if d.rule == "oom" and isinstance(d.evidence, dict)]
    advised = [int(v) for v in advised if isinstance(v, (int, float))]
    ctx = JobContext(all_steps=state.steps, probe_baseline_us=state.probe_baseline_us,
                     ooms_since_step=_last_applied_step(state), ooms_reported=max(advised) if advised else None,
                     period=period(state.job, rules))
    gpus: Optional[Sequence[GpuWindow]] = None
    out = {}
    for rule in rules.rules:
        if rule.scope == "job":
            out[rule.name] = job_reading(rule, win, ctx)
        else:
            if gpus is None:
                gpus = list(state.gpus(win[0].start_ms, win[-1].end_ms)) if state.has_gpus else []
            out[rule.name] = gpu_reading(rule, gpus, rules.controller.gpu_min_samples)
    _gate_fragmentation(out, rules, alloc_retries(win, ctx))
    return out


def _follow_up(state: JobState, rules: RuleSet, open_d: StoredDecision) -> Plan:
    change = next((c for c in state.changes if c.id == open_d.change_id), None)
    if change is not None and change.status == "refused":
        why = f"the job could not apply it: {change.refused_reason or 'no reason given'}"
        return Plan(note=f"decision {open_d.id}: {change.knob} → {change.value:g} refused ({why})", close=open_d.id,
                    outcome="refused", evidence={**open_d.evidence, "closed_because": why, "verdict_ms": state.now_ms,
                                                 "refused_reason": change.refused_reason})
    if change is None or change.status in ("superseded", "cancelled"):
        why = "replaced by a newer change" if change is not None and change.status == "superseded" else \
            "cancelled before the job applied it (mode switched or bounds changed)"
        return Plan(note=f"decision {open_d.id}: {why}", close=open_d.id,
                    outcome="superseded" if change is not None and change.status == "superseded" else "cancelled",
                    evidence={**open_d.evidence, "closed_because": why})
    if change.status != "applied" or change.applied_step is None:
        return Plan(note=f"waiting for the job to apply change {change.id} ({change.knob} → {change.value})")
    knob_now = state.job.knobs.get(change.knob, {}).get("value")
    if knob_now is None or float(knob_now) != float(change.value):
        why = f"the job changed {change.knob} to {knob_now} itself (an OOM, or a new registration)"
        return Plan(note=f"decision {open_d.id}: {why}", close=open_d.id, outcome="superseded",
                    evidence={**open_d.evidence, "closed_because": why}, applied_step=change.applied_step)
    ctl = rules.controller
    every = period(state.job, rules)
    after_steps = [s for s in state.steps if s.step >= change.applied_step + ctl.settle_steps]
    after, complete = _leading(after_steps, ctl.window_min_steps, ctl.window_min_s, every)
    measuring = Plan(note=f"measuring throughput after change {change.id} (from step {change.applied_step + ctl.settle_steps})",
                     applied_step=change.applied_step, measuring=open_d.id if open_d.applied_step is None else None)
    if not complete:
        return measuring
    # While the test cannot tell, the after window grows (up to verdict_max_after_s), then "no measurable gain".
    grown, at_bound = _leading(after_steps, ctl.window_min_steps, max(ctl.window_min_s, ctl.verdict_max_after_s),
                               every)
    before = _before_steps(state, rules, change)
    before_tp = throughput(before) if before else open_d.throughput_before_samples_per_s
    after_tp = throughput(grown)
    evidence = {**open_d.evidence, "after_window": _window_evidence(grown), "verdict_ms": state.now_ms,
                "acks": [{"rank": a.rank, "applied_at_step": a.applied_at_step} for a in change.acks]}
    if before:
        evidence["before_window"] = _window_evidence(before)
    old_every = every if change.knob != ctl.period_knob else max(1, int(round(float(change.previous_value or 1))))
    b_sample = Sample.of(chunk_rates(before, old_every)) if before else None
    a_sample = Sample.of(chunk_rates(grown, every))
    closed = dict(close=open_d.id, throughput_after=after_tp, applied_step=change.applied_step)
    if before_tp and after_tp:
        evidence["gain_pct"] = round(100.0 * (after_tp / before_tp - 1.0), 2)
    predicted = evidence.get("memory_prediction")
    peaks = [s.mem_peak_bytes for s in grown if s.mem_peak_bytes is not None]
    if isinstance(predicted, dict) and peaks and predicted.get("predicted_gib"):
        seen = max(peaks) / GIB
        evidence["memory_observed"] = {"peak_gib": round(seen, 3), "predicted_gib": predicted["predicted_gib"],
                                       "error_pct": round(100.0 * (seen / predicted["predicted_gib"] - 1.0), 1)}
    if any(r.name == open_d.rule and r.safety for r in rules.rules):
        # A safety change (memory, fragmentation) is not undone for speed: it was made to stop an OOM.
        return Plan(note=f"decision {open_d.id}: safety change kept", outcome="kept", evidence=evidence, **closed)
    if b_sample is None or a_sample is None:
        evidence["no_gain"] = True
        return Plan(note=f"decision {open_d.id}: kept (throughput not measurable)", outcome="kept", evidence=evidence,
                    **closed)
    v = compare(b_sample, a_sample, ctl)
    evidence.update(verdict=v.evidence(), before_sample=b_sample.evidence(), after_sample=a_sample.evidence())
    if v.result == INCONCLUSIVE and not at_bound:
        measuring.note = (f"decision {open_d.id}: inconclusive so far ({100 * (v.ratio - 1):+.1f} %, "
                          f"{v.confidence_pct:.0f} % sure): lengthening the after window")
        return measuring
    figures = (f"{before_tp:.2f} → {after_tp:.2f} samples/s ({100 * (v.ratio - 1):+.1f} %, 95 % interval "
               f"{v.ci_pct[0]:+.1f} … {v.ci_pct[1]:+.1f} %, {v.confidence_pct:.0f} % sure)")
    if v.result == WORSE:
        old = _within_bounds(state.job.knobs[change.knob],
                             open_d.old_value if open_d.old_value is not None else change.previous_value)
        if old is None or float(old) == float(change.value):
            # The job narrowed its bounds since (a new registration): the old value is out of them now.
            spec = state.job.knobs[change.knob]
            why = (f"throughput fell ({figures}) but {change.knob}'s old value is outside the job's bounds "
                   f"[{spec['min']}, {spec['max']}] now: not rolled back")
            return Plan(note=f"decision {open_d.id}: {why}", outcome="kept",
                        evidence={**evidence, "no_gain": True, "rollback_blocked": why}, **closed)
        return Plan(note=f"decision {open_d.id}: throughput {figures}: rolling {change.knob} back to {old}",
                    outcome="rolled_back", evidence=evidence, rollback_to=old, rollback_knob=change.knob, **closed)
    if v.result != GAIN:
        evidence["no_gain"] = True
    kind = "kept" if v.result == GAIN else "kept, no measurable gain"
    return Plan(note=f"decision {open_d.id}: throughput {figures}: {kind}", outcome="kept", evidence=evidence,
                **closed)


def _within_bounds(spec: dict, value: Optional[float]) -> Optional[float]:
    """``value`` clamped to the knob's current [min, max]: a rollback never leaves what the job declares now."""
    if value is None:
        return None
    return number(max(float(spec["min"]), min(float(spec["max"]), float(value))))


def _advised_recently(state: JobState, rules: RuleSet, rule: str, knob: Optional[str], new: Optional[float]) -> bool:
    return any(d.rule == rule and d.outcome == "advised" and d.knob == knob
               and (new is None or (d.new_value is not None and float(d.new_value) == new))
               for d in _recent(state.decisions, state.now_ms, rules.controller.advice_repeat_s))


def plan(state: JobState, rules: RuleSet,
         placement: Optional[Callable[[JobState, dict[str, Reading], Sequence[JobStep]], Optional[dict]]] = None) -> Plan:
    """What the controller does now for this job (see the module docstring for the order)."""
    job = state.job
    if job.mode == "off":
        return Plan(note="mode off")
    open_d = next((d for d in state.decisions if d.outcome == "pending"), None)
    if open_d is not None:
        return _follow_up(state, rules, open_d)
    pending = [c for c in state.changes if c.status == "pending"]
    if pending:
        return Plan(note=f"change {pending[0].id} ({pending[0].source}) is in flight")
    ctl = rules.controller
    last = _last_applied_step(state)
    start = (last + ctl.settle_steps + ctl.cooldown_steps) if last is not None else 0
    every = period(job, rules)
    win = window([s for s in state.steps if s.step >= start], ctl.window_min_steps, ctl.window_min_s,
                 ctl.window_max_steps, every)
    if win is None:
        return Plan(note=f"collecting a window (steps from {start})")
    readings = readings_for(state, rules, win)
    tp = throughput(win)
    base_evidence = {"window": _window_evidence(win), "mode": job.mode,
                     "knobs": {k: v["value"] for k, v in job.knobs.items()}}
    for rule in rules.rules:
        reading = readings[rule.name]
        if not reading.fires:
            continue
        evidence = {**base_evidence, "reading": reading.evidence()}
        choice, skipped, policy = _choose(rule, state, rules, readings, Sample.of(chunk_rates(win, every)))
        if skipped:
            evidence["skipped"] = skipped
        for note in policy:
            if isinstance(note, dict):
                evidence.update(note)
            else:
                evidence.setdefault("step_policy", []).append(note)
        advice = rule.advice
        if rule.placement_advice and placement is not None:
            proposal = placement(state, readings, win)
            if proposal is not None:
                evidence["placement"] = proposal
                advice = f"{advice} Proposed device_map: {proposal.get('device_map')} — {proposal.get('expected_effect', '')}"
        if choice is not None:
            action, new = choice
            old = float(job.knobs[action.knob]["value"])
            change = NewChange(rule.name, action.knob, old, new,
                               f"{rule.name}: {reading.message} → {action.describe()} ({old:g} → {new:g})")
            if job.mode == "auto":
                return Plan(note=change.reason, change=change, evidence=evidence, throughput_before=tp, advice=advice,
                            readings=list(readings.values()))
            if _advised_recently(state, rules, rule.name, action.knob, new):
                return Plan(note=f"{rule.name}: advised before ({action.knob} → {new:g})", readings=list(readings.values()))
            return Plan(note=f"advise: {change.reason}", advised=change, evidence=evidence, throughput_before=tp,
                        advice=advice, readings=list(readings.values()))
        if not _advised_recently(state, rules, rule.name, None, None):
            return Plan(note=f"{rule.name}: fires, no action possible ({'; '.join(skipped) or 'advice only'})",
                        advice_rule=rule.name, advice=advice, evidence=evidence, throughput_before=tp,
                        readings=list(readings.values()))
        if rule.safety:
            return Plan(note=f"{rule.name}: fires and blocks lower-priority rules (advised before)",
                        readings=list(readings.values()))
    return Plan(note="no rule fires", readings=list(readings.values()))
