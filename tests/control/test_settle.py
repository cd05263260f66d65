"""The settle after a prefetch raise (src/trimtab/control/settle.py): the steps that drain what the worker ran
ahead into the deeper queue are not the setting's baseline for a move of another knob. The H200 pattern (runs
17–20): prefetch 0 → 2 kept, the 7 steps after it ~15 % fast, then a sync trial measured against them and sent
back although sync 4 is the faster setting. The raise's own verdict and moves of the queue knob do not wait."""

from __future__ import annotations

from tests.support.plans import RULES, acts, change, decision, job, state, steps
from trimtab.control.controller import plan
from trimtab.control.settle import drained_from, settled_from

BANK = RULES.with_overrides({"controller": {"queue_raise_settle_steps": 4}})  # as shipped, said here
NO_BANK = RULES.with_overrides({"controller": {"queue_raise_settle_steps": 0}})
PREFETCH_RAISE = change(id=1, knob="prefetch", value=2, previous=0, applied_step=30)


def test_a_raise_of_the_queue_knob_holds_back_moves_of_other_knobs_per_unit_raised_and_nothing_else_does():
    assert RULES.controller.queue_raise_settle_steps == 4  # the shipped rules (H200 runs 21–23, BENCHMARKS.md)
    assert settled_from(PREFETCH_RAISE, BANK) == 31  # the raise's own setting: settle_steps (1) only
    assert drained_from(PREFETCH_RAISE, BANK, "sync_every") == 31 + 8  # 4 a unit for 0 → 2
    assert drained_from(PREFETCH_RAISE, BANK, "batch_size") == 39
    assert drained_from(PREFETCH_RAISE, BANK, "prefetch") == 31  # the queue knob's next move does not wait
    assert drained_from(change(knob="prefetch", value=3, previous=2, applied_step=30), BANK, "sync_every") == 35
    assert drained_from(change(knob="prefetch", value=2, previous=4, applied_step=30), BANK, "sync_every") == 31
    assert drained_from(change(knob="sync_every", value=4, previous=1, applied_step=30), BANK, "batch_size") == 31
    assert drained_from(change(knob="batch_size", value=64, previous=16, applied_step=30), BANK, "prefetch") == 31
    assert drained_from(PREFETCH_RAISE, NO_BANK, "sync_every") == 31
    queue_is_batch = BANK.with_overrides({"controller": {"queue_knob": "batch_size"}})
    grown = change(knob="batch_size", value=64, previous=16, applied_step=30)
    assert drained_from(grown, queue_is_batch, "prefetch") == 31 + 4 * 48


def _paced(first: int, n: int, step_s: float, comm_share: float) -> list:
    """``n`` steps of ``step_s`` ± 3 % (alternating: a spread, no trend), ``comm_share`` of each the weight sync."""
    out = []
    for i in range(first, first + n):
        t = step_s * (1.03 if i % 2 else 0.97)
        out += steps(i, 1, step_time=t, gen=0.3 * t, ev=0.04 * t, comm=comm_share * t)
    return out


def _after_raise(n_fast: int, n_normal: int) -> list:
    """64/0/1 at 1.0 s a step, then prefetch 0 → 2 at step 30: ``n_fast`` steps of 0.62 s draining the bank, then
    the setting's own 0.75 s; a third of each step is the weight sync (communication-bound: sync_every fires)."""
    return (_paced(20, 10, 1.0, 0.33) + _paced(30, 1, 1.2, 0.33) + _paced(31, n_fast, 0.62, 0.33)
            + _paced(31 + n_fast, n_normal, 0.75, 0.33))


KEPT_RAISE = decision(id=1, outcome="kept", change_id=1, knob="prefetch", old=0, new=2, rule="generation_bound")


def test_the_next_move_waits_until_the_bank_is_drained():
    history = _after_raise(n_fast=7, n_normal=0)  # steps 20–37: the raise and its 7 fast steps
    the_job = job(batch=64, prefetch=2, sync=1)
    without = plan(state(history, the_job, changes=[PREFETCH_RAISE], decisions=[KEPT_RAISE]), NO_BANK)
    acts(without, "communication_bound", "sync_every", 1, 2)  # a sync trial on the drain, as on the H200
    held = plan(state(history, the_job, changes=[PREFETCH_RAISE], decisions=[KEPT_RAISE]), BANK)
    assert held.change is None and held.note == ("communication_bound fires; sync_every waits for change 1 "
                                                 "(prefetch → 2) to drain: a window from step 39"), held.note
    assert held.wait.steps == 1 and held.wait.enough_steps == 20 - 0, held.wait
    moved = plan(state(_after_raise(n_fast=8, n_normal=7), the_job, changes=[PREFETCH_RAISE],
                       decisions=[KEPT_RAISE]), BANK)
    acts(moved, "communication_bound", "sync_every", 1, 2)  # once the setting's own steps make a window


def _sync_trial(applied_step: int, rules) -> object:
    """sync 1 → 2 applied at ``applied_step`` after the raise at 30 (7 fast steps, then the setting's own pace up
    to the trial), then 24 steps at sync 2: 0.70 s a step, 7 % faster than sync 1 runs and 11 % slower than the
    drain read."""
    n_fast = min(8, applied_step - 31)
    history = _after_raise(n_fast, applied_step - 31 - n_fast) + _paced(applied_step, 24, 0.70, 0.15)
    sync = change(id=2, knob="sync_every", value=2, previous=1, applied_step=applied_step)
    pending = decision(id=2, change_id=2, knob="sync_every", old=1, new=2, rule="communication_bound", before=None)
    return plan(state(history, job(batch=64, prefetch=2, sync=2), changes=[sync, PREFETCH_RAISE],
                      decisions=[pending, KEPT_RAISE]), rules)


def test_a_move_after_the_raise_is_judged_against_the_setting_not_against_the_drain():
    # Without the settle, the trial comes 8 steps after the raise (H200 run 19: steps 37 → 45) and its before
    # window is the drain: the faster setting reads lower and goes back.
    early = _sync_trial(applied_step=39, rules=NO_BANK)
    assert early.outcome == "rolled_back" and early.evidence["gain_pct"] < 0, early.note
    # With it, the trial comes once a window of the setting's own steps is in (step 39 on, the test above) and is
    # judged against them: kept.
    late = _sync_trial(applied_step=46, rules=BANK)
    assert late.outcome == "kept" and late.evidence["gain_pct"] > 2, late.note
    assert late.evidence["before_window"]["steps"][0] >= 39, late.evidence["before_window"]


def test_the_raise_itself_is_judged_from_its_settle_step_the_drain_counted_as_its_gain():
    """The raise's own verdict does not wait for the drain (a job whose only moving knob is the queue decides as
    without the settle): its after window starts at the plain settle step."""
    history = _paced(10, 20, 1.0, 0.33) + _after_raise(n_fast=7, n_normal=8)[10:]
    pending = decision(id=1, change_id=1, knob="prefetch", old=0, new=2, rule="generation_bound", before=None)
    for rules in (BANK, NO_BANK):
        judged = plan(state(history, job(batch=64, prefetch=2, sync=1), changes=[PREFETCH_RAISE],
                            decisions=[pending]), rules)
        assert judged.outcome == "kept", judged.note
        assert judged.evidence["after_window"]["steps"][0] == 31, judged.evidence["after_window"]
