"""Memory the job does not own (issue 38): another process's memory on the GPU, read from the free memory the job
reports, lowers the line the memory model plans against — a raise stops below it and the forecast cuts a batch that
no longer fits beside it — and the steps after the hook's own OOM halving are labelled with the batch they ran at."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.plans import GIB, RULES, acts, change, job, state, steps
from trimtab.control.controller import plan
from trimtab.control.memory_fit import fit, others_bytes
from trimtab.control.plan import Cadence, Wait
from trimtab.control.service import Rebalancer

TOTAL = 141 * GIB
CTL = RULES.controller


def per_sample(gib: float):
    return lambda b: 2 * GIB + b * gib * GIB


def generating(n: int):
    return steps(0, n, step_time=1.0, gen=0.9, ev=0.02, comm=0.01)


def reporting(history, batch_of, peak_of, others_of=lambda s: None, knobs=True):
    """Steps whose batch (reported as the value they ran at), allocator peak and, where ``others_of`` gives a
    figure, the GPU's free memory beside that much held by another process."""
    out = []
    for s in history:
        b = batch_of(s.step)
        peak, held = peak_of(b), others_of(s.step)
        reported = {"total_bytes": TOTAL, "peak_allocated_bytes": peak, "reserved_bytes": peak,
                    **({"knobs": {"batch_size": b}} if knobs else {}),
                    **({"free_bytes": TOTAL - peak - held} if held is not None else {})}
        out.append(replace(s, samples=b, mem_peak_bytes=peak, mem_total_bytes=TOTAL, reported=reported))
    return out


def test_memory_another_process_holds_lowers_the_line_by_what_it_holds():
    history = reporting(steps(0, 20, step_time=1.0), lambda s: 16 if s < 10 else 32, per_sample(1.5),
                        others_of=lambda s: 0 if s < 15 else 50 * GIB)
    alone = fit(history[:15], [change(value=32, previous=16, applied_step=10)], "batch_size", 32, CTL)
    beside = fit(history, [change(value=32, previous=16, applied_step=10)], "batch_size", 32, CTL)
    assert alone.others_bytes == 0 and beside.others_bytes == pytest.approx(50 * GIB)
    assert beside.line_bytes == pytest.approx(alone.line_bytes - 50 * GIB)
    # 2 + 1.5 b GiB under the line less the margin (3 % of the GPU), less the 50 GiB beside
    room = TOTAL * (CTL.memory_line_pct - CTL.memory_margin_pct) / 100.0 - 2 * GIB
    assert alone.largest_fitting() == int(room / (1.5 * GIB))
    assert beside.largest_fitting() == int((room - 50 * GIB) / (1.5 * GIB))
    assert beside.evidence(32)["others_gib"] == pytest.approx(50.0)


def test_others_are_total_less_free_less_the_jobs_own_reserved_the_most_of_the_newest_readings():
    history = reporting(steps(0, 6, step_time=1.0), lambda s: 16, per_sample(1.0),
                        others_of=lambda s: [None, 10 * GIB, 30 * GIB, 20 * GIB, 5 * GIB, 8 * GIB][s])
    assert others_bytes(history) == pytest.approx(20 * GIB)  # the newest three: 20, 5, 8
    assert others_bytes(history[:1]) is None  # no free memory reported: nothing known of others


def test_a_neighbour_that_arrives_cuts_a_batch_that_no_longer_fits_beside_it():
    """Batch 80 (122 GiB) fits alone; 15 GiB taken by another process leaves it no room under the line (no OOM
    yet: 137 GiB fits under 141, but not under the line) — the forecast lowers it to what fits beside the neighbour."""
    the_job = job(batch=80, batch_max=128)
    history = reporting(generating(30), lambda s: 40 if s < 10 else 80, per_sample(1.5),
                        others_of=lambda s: 0 if s < 26 else 15 * GIB)
    p = plan(state(history, the_job, changes=[change(value=80, previous=40, applied_step=10)]), RULES)
    assert p.change is not None and p.change.rule == "memory_forecast", p.note
    fitted = fit(history, [change(value=80, previous=40, applied_step=10)], "batch_size", 80, CTL)
    acts(p, "memory_forecast", "batch_size", 80, float(fitted.largest_fitting()))
    assert 2 * GIB + 1.5 * GIB * p.change.new_value + 15 * GIB <= 0.95 * TOTAL
    # Without the free memory the same steps plan nothing: the job's own peak is well under the line.
    blind = reporting(generating(30), lambda s: 40 if s < 10 else 80, per_sample(1.5))
    unseen = plan(state(blind, the_job, changes=[change(value=80, previous=40, applied_step=10)]), RULES)
    assert unseen.change is None or unseen.change.rule != "memory_forecast", unseen.note


def test_steps_after_the_hooks_own_oom_halving_are_labelled_with_the_batch_they_ran_at():
    """16 → 71 (a change), an OOM at its first step, the hook's own halving 71 → 35 (no change records it). The steps
    at 35 report that they ran at 35: the fit sees 16 and 35 (1 GiB a sample) — not 35's peak labelled 71, which
    put batch 70 at half its real need (the issue's 53.9 GiB predicted at 70, 72 true)."""
    batch_of = lambda s: 16 if s < 20 else 71 if s == 20 else 35  # noqa: E731
    moved = [change(value=71, previous=16, applied_step=20)]
    history = reporting(steps(0, 40, step_time=1.0), batch_of, per_sample(1.0))
    history = [replace(s, num_ooms=0 if s.step < 20 else 1) for s in history]  # (the OOM's own peak: left out)
    f = fit(history, moved, "batch_size", 35, CTL)
    assert {p.value for p in f.points} == {16.0, 35.0}
    assert f.predict(70) == pytest.approx(72 * GIB, rel=0.01)
    unlabelled = [replace(s, reported={k: v for k, v in s.reported.items() if k != "knobs"}) for s in history]
    assert fit(unlabelled, moved, "batch_size", 35, CTL).predict(70) < 0.6 * 72 * GIB  # the label bug


def test_a_stretch_that_hit_an_oom_is_no_point_of_the_fit():
    history = reporting(steps(0, 10, step_time=1.0), lambda s: 32, per_sample(1.0))
    history = [replace(s, num_ooms=0 if s.step < 6 else 1) for s in history]
    history[6] = replace(history[6], mem_peak_bytes=5 * GIB)  # what was allocated before the failure
    f = fit(history, [], "batch_size", 32, CTL)
    assert len(f.points) == 9 and min(p.peak_bytes for p in f.points) == pytest.approx(34 * GIB)


def test_a_report_that_shows_a_neighbour_arrived_is_planned_at_once_not_a_window_later(sqlite_engine):
    """The rebalancer plans a job once per window (up to 20 fast steps); a report whose free memory shows another
    process took more than the memory margin since the rank's last report is planned at once."""
    rb, asked = Rebalancer(sqlite_engine), []
    rb._request_plan = lambda the_job, forced=False: asked.append(forced)
    the_job = job()
    rb._cadence[the_job.name] = Cadence(the_job.updated_ms, 10, Wait(steps=20, seconds=100.0))  # a window away

    def memory(held_gib: float) -> dict:
        return {"total_bytes": TOTAL, "reserved_bytes": 60 * GIB, "free_bytes": TOTAL - 60 * GIB - held_gib * GIB}
    for step, held in ((11, 0.0), (12, 1.0), (13, 2.0)):
        rb.after_report(the_job, step, 1.0, memory=memory(held))
    assert asked == []  # nothing moved beyond the margin: the window's wait stands
    rb.after_report(the_job, 14, 1.0, memory=memory(30.0))
    assert asked == [True]
    rb.after_report(the_job, 15, 1.0, memory=memory(30.0), rank=0)
    assert asked == [True]  # still there: no plan per report
