"""A raise of the queue knob judged past the drain its own steps show (src/trimtab/control/drain.py): the bench's
banking job raised prefetch 2 → 4 (−7 % true) at sync 8, its first 8 steps drained the bank 15 % fast, and the
verdict, reading the fast period beside the slow ones, could not tell for 48 steps."""

from __future__ import annotations

from tests.support.plans import RULES, change, decision, job, state, steps
from trimtab.control.controller import plan
from trimtab.control.drain import drain_read

NOISE = (1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.99, 0.98, 1.01, 1.0, 0.97, 1.03)  # a spread, no trend


def _synced(first: int, n: int, x: float) -> list:
    """``n`` steps from ``first`` of 0.5 s (a 0.25 s weight sync every 8th), ×``x`` and a ±3 % spread."""
    out = []
    for i in range(first, first + n):
        t = (0.5 + (0.25 if (i + 1) % 8 == 0 else 0.0)) * x * NOISE[i % len(NOISE)]
        out += steps(i, 1, step_time=t, gen=0.25 * t, ev=0.0, comm=0.0, samples=16)
    return out


RAISE = change(id=5, knob="prefetch", value=4, previous=2, applied_step=38)


def _history(bank: float, after: int) -> list:
    """prefetch 2 until step 37 (sync 8 from 30), the raise landing at 38, 8 steps of the drain (×``bank``), then
    ``after`` steps of the setting itself (7 % slower than prefetch 2)."""
    return _synced(22, 16, 1.0) + _synced(38, 1, 1.07) + _synced(39, 8, bank * 1.07) + _synced(47, after, 1.07)


def _judge(history: list, rules=RULES):
    pending = decision(id=5, change_id=5, knob="prefetch", old=2, new=4, rule="generation_bound", before=None)
    return plan(state(history, job(batch=16, prefetch=4, sync=8), changes=[RAISE], decisions=[pending]), rules)


def test_a_drain_its_steps_show_moves_the_raise_s_after_window_past_it():
    history = _history(bank=0.85, after=16)
    read = drain_read(RAISE, RULES, history, 39, 8)
    assert read is not None and read["from"] == 39 and read["to"] == 47 and read["ratio"] < 0.9, read
    judged = _judge(history)
    assert judged.outcome == "rolled_back" and judged.evidence["verdict"]["result"] == "worse", judged.note
    assert judged.evidence["after_window"]["steps"][0] == 47, judged.evidence["after_window"]
    assert judged.evidence["after_window_past_drain"] == read
    # Without the drain (queue_raise_settle_steps 0: no steps of it to read) the fast period is in the after
    # window: the same steps cannot tell yet, and the window grows.
    blind = _judge(history, RULES.with_overrides({"controller": {"queue_raise_settle_steps": 0}}))
    assert blind.outcome is None and "inconclusive so far" in blind.note, blind.note


def test_a_raise_that_banks_nothing_is_judged_from_its_settle_step():
    history = _history(bank=1.0, after=16)
    assert drain_read(RAISE, RULES, history, 39, 8) is None
    judged = _judge(history)
    assert judged.evidence["after_window"]["steps"][0] == 39 and "after_window_past_drain" not in judged.evidence


def test_the_drain_is_read_only_once_as_many_periods_past_it_are_in_and_only_for_a_raise_of_the_queue_knob():
    assert drain_read(RAISE, RULES, _history(bank=0.85, after=7), 39, 8) is None  # 7 of the 8 steps past it
    cut = change(id=5, knob="prefetch", value=2, previous=4, applied_step=38)
    assert drain_read(cut, RULES, _history(bank=0.85, after=16), 39, 8) is None
    sync = change(id=5, knob="sync_every", value=8, previous=2, applied_step=38)
    assert drain_read(sync, RULES, _history(bank=0.85, after=16), 39, 8) is None
