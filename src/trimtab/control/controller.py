"""The per-job controller: from what the store holds about a job (its steps, changes, decisions, GPU samples), what
to do now — nothing, follow up the change in flight (keep it or roll it back), queue one new change, or record
advice.

``plan()`` is pure: it reads a :class:`JobState` and returns a :class:`Plan`, so every rule, the hysteresis, the
cooldown, the bounds, the OOM ceiling, the rollback and the priority are tested on recorded windows without a
server. The state lives only in the store (one pending decision at most per job, its change, the acks), so a
restarted daemon picks up a change in flight where it was and never queues it twice.

Order of business (one change in flight per job, each measured before the next):
1. mode ``off`` → nothing.
2. A decision still pending → ``follow_up.py``: close it if the job refused its change or it was replaced, wait
   for the job to apply it, then judge it by a t-test on the per-period throughputs before and after it — kept (a
   gain, or an unconfirmed one above the dead band) or rolled back (a loss, or nothing shown above the dead band:
   back to the known setting).
3. Any other change pending (an admin's, a rollback) → wait. A batch bound by memory (``memory_follow.py``: its
   raise gained and was cut by the memory fit) moves to the memory line at every step, before any window.
4. A window of steps after the last applied change (+ settle + cooldown) → grade every rule on it; the first rule
   (by priority) that fires — or, after every rule that fires, one that follows its last measured gain through below
   its line (``follow_above``) — and has an action it may take (``choose.py``) acts (``auto``) or advises (``advise``). Where the action goes is ``history.py``'s:
   short of values measured worse (the bracket search, both ways), never a move whose verdict still holds. A
   safety rule that fires and cannot act stops lower rules: speed never goes before memory. No change (safety
   aside) is decided while the steps it would be judged against still trend (a warm-up): the change would be
   credited with the settling. A job whose lengths drift is read at equal length there (``drift.py``): a drift
   the tokens explain is not a warm-up. A validation or checkpoint step every k steps enters no window
   (``grading/periodic.py``).

Every plan says when planning again could change anything (``Plan.wait``): the daemon plans per window. A plan that
decides nothing says why as data (``Plan.gate``, gates.py: the gate, the rule it held, the window, the data it
misses, the step it expects to decide at), kept per job and served by the job's API and ``check``. A window without
measurable throughput decides no change (lost_steps.py: a step lost to an OOM is not a rate of 0).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Sequence

from trimtab.contract.statuses import ADVISED, APPLIED, PENDING, SUPERSEDED
from trimtab.control import gates
from trimtab.control.gates import Gate, expected_step, no_action_gate
from trimtab.control.held import advised_gate, gated_follow_up
from trimtab.control.lost_steps import lost_steps, measured_throughput
from trimtab.control import memory_follow, memory_forecast as forecast
from trimtab.control.bracket import follows_through
from trimtab.control.choose import choose as _choose
from trimtab.control.drift import at_equal_length
from trimtab.control.persistence import persistence
from trimtab.control.settle import drained_from, settled_from
from trimtab.control.effect import before_too_short
from trimtab.control.goodput import blind_to_learning
from trimtab.control.plan import (JobState, NewChange, Plan, Wait, before_window, last_applied, last_applied_step,
                                  longest_period, period, window_evidence, window_wait)
from trimtab.grading.rules import ControllerSettings, Rule, RuleSet
from trimtab.grading.signals import GpuWindow, JobContext, Reading, alloc_retries, gpu_reading, job_reading
from trimtab.control.verdict import unsettled
from trimtab.grading.periodic import without_heavy
from trimtab.grading.window import JobStep, screen, throughput, window
from trimtab.store.decisions import StoredDecision

__all__ = ["JobState", "NewChange", "Plan", "Wait", "plan", "period", "readings_for"]


def _recent(decisions: Sequence[StoredDecision], now_ms: int, within_s: float) -> list[StoredDecision]:
    return [d for d in decisions if now_ms - d.ts_ms <= within_s * 1000]


def _forecast_cuts_short(state: JobState, rules: RuleSet, open_d: StoredDecision) -> Optional[Plan]:
    """A change being measured is closed unjudged when the memory forecast fires at its value: the job's growth
    does not wait for the verdict (the lower follows on the same report, see ``Rebalancer._evaluate``)."""
    change = next((c for c in state.changes if c.id == open_d.change_id), None)
    if change is None or change.status != APPLIED or change.applied_step is None:
        return None
    if not any(s.step >= change.applied_step + rules.controller.settle_steps for s in state.steps):
        return None
    fired = forecast.preempts(state, rules)
    if fired is None or (fired[0].name == open_d.rule):
        return None  # a forecast lower itself is kept (a safety change) once its window is in
    rule, reading = fired
    why = f"memory forecast: {reading.message}"
    return Plan(note=f"decision {open_d.id}: cut short, {why}", close=open_d.id, outcome=SUPERSEDED,
                applied_step=change.applied_step,
                evidence={**open_d.evidence, "closed_because": why, "verdict_ms": state.now_ms})


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
                     ooms_since_step=last_applied_step(state), ooms_reported=max(advised) if advised else None,
                     period=period(state.job, rules, state.steps))
    gpus: Optional[Sequence[GpuWindow]] = None
    out = {}
    # a knob that follows the memory line at every step needs to fit only until its next move
    ahead_s = memory_follow.follow_ahead_s(state, rules) if memory_follow.bound_knob(state, rules) else None
    for rule in rules.rules:
        if rule.signal == forecast.SIGNAL:
            out[rule.name] = forecast.reading(rule, state, rules, ahead_s)
        elif rule.scope == "job":
            out[rule.name] = job_reading(rule, win, ctx)
        else:
            if gpus is None:
                gpus = list(state.gpus(win[0].start_ms, win[-1].end_ms)) if state.has_gpus else []
            out[rule.name] = gpu_reading(rule, gpus, rules.controller.gpu_min_samples)
    _gate_fragmentation(out, rules, alloc_retries(win, ctx))
    return out


def _collecting(steps: list[JobStep], ctl: ControllerSettings) -> Wait:
    """How long until ``steps`` (the newest since a start) make a window."""
    return Wait(steps=1, seconds=max(0.0, ctl.window_min_s - sum(s.step_time_s for s in steps)),
                enough_steps=max(1, ctl.window_enough_steps - len(steps)))


def _advised_recently(state: JobState, rules: RuleSet, rule: str, knob: Optional[str], new: Optional[float]) -> bool:
    return any(d.rule == rule and d.outcome == ADVISED and d.knob == knob
               and (new is None or (d.new_value is not None and float(d.new_value) == new))
               for d in _recent(state.decisions, state.now_ms, rules.controller.advice_repeat_s))


def _advice_plan(rule: Rule, advice: Optional[str], skipped: list[str], evidence: dict, tp: Optional[float],
                 readings: dict[str, Reading], wait: Wait) -> Plan:
    return Plan(note=f"{rule.name}: fires, no action possible ({'; '.join(skipped) or 'advice only'})",
                advice_rule=rule.name, advice=advice, evidence=evidence, throughput_before=tp,
                readings=list(readings.values()), wait=wait)


def plan(state: JobState, rules: RuleSet,
         placement: Optional[Callable[[JobState, dict[str, Reading], Sequence[JobStep]], Optional[dict]]] = None) -> Plan:
    """What the controller does now for this job (see the module docstring for the order). Steps far off the
    job's own (``outlier_x_median``) enter no window: a decision's evidence names them and why."""
    ctl = rules.controller
    kept, excluded = screen(state.steps, ctl.outlier_x_median, longest_period(state, rules))
    kept, heavy = without_heavy(kept, ctl.periodic_heavy_x, ctl.periodic_min_repeats)
    state = replace(state, steps=kept) if excluded or heavy else state
    result = _plan(state, rules, placement)
    if memory_follow.bound_knob(state, rules) is not None:
        result.wait = Wait(steps=1)  # the memory line is followed at every step
    decided = result.change or result.advised or result.advice_rule or result.close is not None
    if excluded and decided:
        result.evidence = {**result.evidence, "excluded_steps": excluded[-20:], "excluded_steps_count": len(excluded)}
    if heavy is not None:
        if decided:
            result.evidence = {**result.evidence, "periodic_steps_left_out": heavy.evidence()}
        result.note += f" [{heavy.evidence()['how']}]"
    return result


def _plan(state: JobState, rules: RuleSet,
          placement: Optional[Callable[[JobState, dict[str, Reading], Sequence[JobStep]], Optional[dict]]]) -> Plan:
    job = state.job
    ctl = rules.controller
    every = period(job, rules, state.steps)
    # Until a new window's worth of steps is in, the same rules would read the same figures: plan per window.
    next_window = window_wait(rules, every)
    if job.mode == "off":
        return Plan(note="mode off", wait=next_window, gate=Gate(gates.MODE_OFF))
    open_d = next((d for d in state.decisions if d.outcome == PENDING), None)
    if open_d is not None:
        cut = _forecast_cuts_short(state, rules, open_d)
        return cut if cut is not None else gated_follow_up(state, rules, open_d)
    pending = [c for c in state.changes if c.status == PENDING]
    followed = None if pending else memory_follow.move(state, rules)
    if followed is not None:
        return followed
    if pending:
        return Plan(note=f"change {pending[0].id} ({pending[0].source}) is in flight", wait=next_window,
                    gate=Gate(gates.IN_FLIGHT, missing=f"the job's acknowledgement of change {pending[0].id}"))
    last = last_applied(state)
    start = (settled_from(last, rules) + ctl.cooldown_steps) if last is not None else 0
    candidates = [s for s in state.steps if s.step >= start]
    first_x = memory_follow.first_window_x(state, rules) if last is None else 1.0
    wctl = memory_follow.climb_settings(ctl, first_x)
    win = window(candidates, wctl.window_min_steps, wctl.window_min_s, wctl.window_max_steps, every,
                 wctl.window_enough_steps)
    if win is None and candidates and forecast.preempts(state, rules) is not None:
        # the memory forecast fires (a neighbour arrived): a safety lower does not wait for a window of whole sync
        # periods — at a sync every 16 steps that was 5 steps above the line after a raise was cut short
        win = candidates
    if win is None:
        w = _collecting(candidates, wctl)
        # a first climb's shorter window may become possible with any step (memory_follow.climb_possible)
        every_step = last is None and first_x >= 1.0 and memory_follow.climb_possible(state, rules)
        return Plan(note=f"collecting a window (steps from {start})", wait=Wait(steps=1) if every_step else w, gate=Gate(
            gates.COLLECTING, window=window_evidence(candidates) if candidates else None,
            missing=f"{w.seconds:.1f} s more of step time or {w.enough_steps} more steps (a window from step {start})",
            expects_step=expected_step(state.steps, w.steps, w.seconds, w.enough_steps) if state.steps
            else None))
    # how the job's periods persist: read only by a plan that judges a window (a few ms over thousands of steps)
    state = replace(state, persistence=persistence(state, rules))
    readings = readings_for(state, rules, win)
    tp = measured_throughput(win)  # (an OOM's samples=0 is a lost step, not a slower one: lost_steps.py)
    win_evidence = window_evidence(win)
    held: Optional[Plan] = None  # the first rule that fires and was held: what the plan says when none decides
    base_evidence = {"window": win_evidence, "mode": job.mode,
                     "knobs": {k: v["value"] for k, v in job.knobs.items()}}
    now = state.persistence.sample(win, every)
    if state.persistence.rho > 0:
        base_evidence["persistence"] = state.persistence.evidence()
    # Rules that fire first (by priority), then those that only follow a gain through below their line: a rule
    # that fires outranks one whose cause is mostly gone (the mix: sync 16 → 32 followed through for +3.5 % and was
    # measured for 64 steps while generation fired at 84 % of the step, its batch raise worth ×2.2 waiting)
    for rule in sorted(rules.rules, key=lambda r: not readings[r.name].fires):
        reading = readings[rule.name]
        follow = None if reading.fires else follows_through(state, rule, reading)
        if not reading.fires and follow is None:
            continue
        evidence = {**base_evidence, "reading": reading.evidence()}
        choice, skipped, policy = _choose(rule, state, rules, readings, now, follow)
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
        if choice is not None and not rule.safety:
            # A change is judged against the steps before it: while they have not settled (a warm-up, a restart,
            # a mode switch) the verdict would credit the settling to the change. Safety changes do not wait. A
            # move of another knob after a prefetch raise is judged against the steps after the raise's drain
            # (settle.py): until they make a window, it waits.
            knob = choice[0].knob
            if now is None:  # a change is judged on throughput: a window without any decides nothing
                lost = lost_steps(win)
                return Plan(note=f"{rule.name} fires; no decision: no measurable throughput in the window "
                                 f"({len(lost)} of its {len(win)} steps lost"
                                 + (f"; step {lost[0].step}: {lost[0].why}" if lost else "") + ")",
                            readings=list(readings.values()), wait=next_window,
                            gate=Gate(gates.NOT_MEASURABLE, rule=rule.name, window=win_evidence,
                                      missing="samples per step (the hook's step_end(samples=…))",
                                      expects_step=expected_step(state.steps, next_window.steps,
                                                                 next_window.seconds, next_window.enough_steps)))
            drained = drained_from(last, rules, knob) if last is not None else start
            base = [s for s in candidates if s.step >= drained]
            if drained > start and window(base, ctl.window_min_steps, ctl.window_min_s, ctl.window_max_steps, every,
                                          ctl.window_enough_steps) is None:
                w = _collecting(base, ctl)
                return Plan(note=f"{rule.name} fires; {knob} waits for change {last.id} ({last.knob} → "
                                 f"{last.value:g}) to drain: a window from step {drained}",
                            readings=list(readings.values()), wait=w,
                            gate=Gate(gates.DRAINING, rule=rule.name, window=win_evidence,
                                      missing=f"a window of steps from step {drained}",
                                      expects_step=expected_step(state.steps, w.steps, w.seconds, w.enough_steps)))
            # a before window of one long sync period is one draw of the job's noise: a move whose expected gain
            # that noise could hide waits for more of them (effect.py)
            short = before_too_short(state, rules, (rule, reading), choice, base, every, win_evidence)
            if short is not None:
                short.readings = list(readings.values())
                return short
            # read at equal length where the job's lengths drift (drift.py): a drift the tokens explain is the job's
            # work changing, not a baseline still settling
            baseline, length_model = at_equal_length(base, before_window(base, rules, every), ctl)
            drift = unsettled(baseline, every, ctl)
            if drift is not None:
                at = "" if length_model is None else \
                    f" at {length_model.ref_tokens:.0f} tokens per sample, the length's own drift taken out"
                return Plan(note=f"{rule.name} fires; waiting for the throughput to settle before a change (the "
                                 f"before window's throughput{at} moved {drift.change_pct:+.1f} % across it, "
                                 f"{drift.confidence_pct:.0f} % sure)", readings=list(readings.values()),
                            wait=next_window,
                            gate=Gate(gates.SETTLING, rule=rule.name, window=win_evidence,
                                      why=f"the before window's throughput{at} moved {drift.change_pct:+.1f} % "
                                          f"across it ({drift.confidence_pct:.0f} % sure)"))
            if length_model is not None:
                evidence["drift_model"] = length_model.evidence()
        if choice is not None:
            action, new = choice
            old = float(job.knobs[action.knob]["value"])
            how = "bracket search" if any(isinstance(n, str) and n.startswith("bracket search") for n in policy) \
                else action.describe_move(old, new)
            change = NewChange(rule.name, action.knob, old, new,
                               f"{rule.name}: {reading.message} → {how} ({old:g} → {new:g})")
            blind = blind_to_learning(rules, action.knob, candidates)
            if job.mode == "auto" and blind is None:
                return Plan(note=change.reason, change=change, evidence=evidence, throughput_before=tp, advice=advice,
                            readings=list(readings.values()), wait=next_window)
            if blind is not None:
                change = replace(change, reason=f"{change.reason}; {blind}")
            if _advised_recently(state, rules, rule.name, action.knob, new):
                return Plan(note=f"{rule.name}: advised before ({action.knob} → {new:g})",
                            readings=list(readings.values()), wait=next_window,
                            gate=advised_gate(state, rules, rule.name, win_evidence, f"{action.knob} → {new:g}"))
            return Plan(note=f"advise: {change.reason}", advised=change, evidence=evidence, throughput_before=tp,
                        advice=advice, readings=list(readings.values()), wait=next_window)
        if follow is not None:
            continue  # below its act line the rule only follows a gain through; it has nothing to advise
        if not _advised_recently(state, rules, rule.name, None, None):
            return _advice_plan(rule, advice, skipped, evidence, tp, readings, next_window)
        why = "; ".join(skipped) or "advice only"
        if rule.safety:
            return Plan(note=f"{rule.name}: fires and blocks lower-priority rules (advised before)",
                        readings=list(readings.values()), wait=next_window,
                        gate=Gate(gates.SAFETY, rule=rule.name, why=why, window=win_evidence))
        if held is None:  # fires, no action possible, advised already: the next rule may act; else this says why
            held = Plan(note=f"{rule.name}: fires, no action possible ({why}); advised before",
                        readings=list(readings.values()), wait=next_window,
                        gate=Gate(no_action_gate(skipped), rule=rule.name, why=why, window=win_evidence))
    if held is not None:
        return held
    return Plan(note="no rule fires", readings=list(readings.values()), wait=next_window,
                gate=Gate(gates.NO_RULE, window=win_evidence))

