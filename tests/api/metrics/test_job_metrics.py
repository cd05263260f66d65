"""/metrics for jobs and the rebalancer: each live job's newest window (throughput, step time, phase shares,
fragmentation, collective latency and its baseline), knobs with bounds, the grade of its rows, and the decisions
and changes as counters from the store — unknown values absent, never 0, read with a fixed number of queries."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from trimtab.api.metrics import render_metrics
from trimtab.store import changes as change_store
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store

from .conftest import Feeder, scrape

KNOBS = {"batch_size": {"value": 4, "min": 1, "max": 64}, "prefetch": {"value": 2, "min": 0, "max": 8},
         "sync_every": {"value": 1, "min": 1, "max": 8}}
GAUGES = ("trimtab_job_samples_per_second", "trimtab_job_step_time_seconds", "trimtab_job_phase_share_ratio",
          "trimtab_job_fragmentation_ratio", "trimtab_job_collective_latency_seconds",
          "trimtab_job_collective_latency_baseline_seconds", "trimtab_job_knob_value", "trimtab_job_knob_min",
          "trimtab_job_knob_max", "trimtab_job_check_status", "trimtab_job_last_report_timestamp_seconds",
          "trimtab_rebalancer_decisions_pending", "trimtab_rebalancer_changes_pending")
COUNTERS = ("trimtab_rebalancer_decisions_total", "trimtab_rebalancer_changes_total")


def register(ctx, name="grpo", ranks=2, hostnames=("sim-a",), mode="auto"):
    job, _ = job_store.register_job(ctx.engine, name, ranks, {"actor": [0]}, list(hostnames), KNOBS, mode, None, True)
    return job


def report(ctx, job, steps, step_time=2.0, gen=1.2, ev=0.4, comm=0.1, upd=0.3, other=None, samples=8,
           frag=0.12, latency=None):
    for step in steps:
        for rank in range(job.ranks):
            assert job_store.add_report(ctx.engine, job.id, dict(
                step=step, rank=rank, step_time_s=step_time, generation_s=gen, evaluation_s=ev,
                communication_s=comm, update_s=upd, other_s=other, samples=samples, fragmentation=frag,
                num_alloc_retries=0, collective_latency_us=latency))


def of(got, name, **match) -> dict:
    """{frozenset of the labels not in ``match``: value} of the samples of ``name`` whose labels include match."""
    return {frozenset((k, v) for k, v in labels.items() if k not in match): value
            for labels, value in got.get(name, []) if all(labels.get(k) == v for k, v in match.items())}


def one(got, name, **labels) -> float:
    [value] = [v for lab, v in got.get(name, []) if lab == labels]
    return value


def test_a_jobs_newest_window_is_exported_with_its_units(ctx):
    Feeder(ctx).simulated(hostname="sim-a", n_gpus=2, ticks=1)  # the job's node is simulated
    job = register(ctx)
    for step, us in enumerate([10.0, 10.0, 10.0, 10.0, 60.0]):  # baseline: the median, 10 µs
        report(ctx, job, [step], latency=us)
    report(ctx, job, range(5, 8), latency=30.0)
    got = scrape(ctx)
    labels = {"job": "grpo", "mode": "auto", "simulated": "true"}
    # window: steps 6–7 (4 s); both ranks' 8 samples per 2-s step
    assert one(got, "trimtab_job_samples_per_second", **labels) == pytest.approx(8.0)
    assert one(got, "trimtab_job_step_time_seconds", **labels) == pytest.approx(2.0)
    assert of(got, "trimtab_job_phase_share_ratio", **labels) == {
        frozenset({("phase", "generation")}): pytest.approx(0.6), frozenset({("phase", "evaluation")}): pytest.approx(0.2),
        frozenset({("phase", "communication")}): pytest.approx(0.05), frozenset({("phase", "update")}): pytest.approx(0.15)}
    assert one(got, "trimtab_job_fragmentation_ratio", **labels) == pytest.approx(0.12)
    assert one(got, "trimtab_job_collective_latency_seconds", **labels) == pytest.approx(30e-6)
    assert one(got, "trimtab_job_collective_latency_baseline_seconds", **labels) == pytest.approx(10e-6)
    for suffix, key in (("value", "value"), ("min", "min"), ("max", "max")):
        assert of(got, f"trimtab_job_knob_{suffix}", **labels) == {
            frozenset({("knob", k)}): spec[key] for k, spec in KNOBS.items()}
    assert of(got, "trimtab_job_check_status", **labels) == {
        frozenset({("check", "step_composition")}): 2.0,   # generation 60 % > 50 %
        frozenset({("check", "fragmentation")}): 0.0,      # 12 % < 15 %
        frozenset({("check", "collective_latency")}): 2.0}  # 3 × baseline
    last = one(got, "trimtab_job_last_report_timestamp_seconds", **labels)
    assert abs(last - time.time()) < 60
    # while a job reports, the node's balance series leave the job checks to the job series
    assert {lab["check"] for lab, _ in got["trimtab_balance_status"]} == {"utilization_spread", "pcie", "memory"}


def test_help_and_type_of_every_family(ctx):
    job = register(ctx)
    report(ctx, job, range(8), latency=10.0)
    decision_store.add_decision(ctx.engine, job.id, "generation_bound", {}, outcome="advised")
    first = change_store.queue_change(ctx.engine, job.id, "prefetch", 3, "op")
    change_store.ack_change(ctx.engine, job.id, first.id, 0, 5)
    change_store.queue_change(ctx.engine, job.id, "prefetch", 4, "op")
    text = render_metrics(ctx).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in GAUGES:
        assert families[name].type == "gauge", name
        assert f"# TYPE {name} gauge" in text and len(families[name].documentation) > 20, name
    for name in COUNTERS:
        base = name.removesuffix("_total")
        assert families[base].type == "counter", name
        assert f"# TYPE {name} counter" in text and "counted once settled" in families[base].documentation
    units = [line for line in text.splitlines() if line.startswith("# HELP trimtab_job_")
             and ("_seconds " in line or "_ratio " in line or "_per_second " in line)]
    assert units and all("Unit: " in line or "Unix time" in line for line in units), units


def test_unknown_values_are_absent_not_zero(ctx):
    bare = register(ctx, name="bare", ranks=1, hostnames=["real-node"])
    report(ctx, bare, range(6), gen=None, ev=None, comm=None, upd=None, samples=None, frag=None, latency=None)
    partial = register(ctx, name="partial", ranks=1, hostnames=["real-node"])
    report(ctx, partial, range(3), latency=10.0)  # three probes: no baseline yet
    got = scrape(ctx)
    bare_l = {"job": "bare", "mode": "auto"}
    assert one(got, "trimtab_job_step_time_seconds", **bare_l) == pytest.approx(2.0)
    for name in ("trimtab_job_samples_per_second", "trimtab_job_phase_share_ratio", "trimtab_job_fragmentation_ratio",
                 "trimtab_job_collective_latency_seconds", "trimtab_job_collective_latency_baseline_seconds",
                 "trimtab_job_check_status"):
        assert of(got, name, **bare_l) == {}, name
    part_l = {"job": "partial", "mode": "auto"}
    assert one(got, "trimtab_job_collective_latency_seconds", **part_l) == pytest.approx(10e-6)
    assert of(got, "trimtab_job_collective_latency_baseline_seconds", **part_l) == {}
    assert frozenset({("phase", "other")}) not in of(got, "trimtab_job_phase_share_ratio", **part_l)  # not reported
    assert set(of(got, "trimtab_job_check_status", **part_l)) == {
        frozenset({("check", "step_composition")}), frozenset({("check", "fragmentation")})}
    # real nodes' jobs carry no simulated label
    assert all("simulated" not in lab for name in GAUGES for lab, _ in got.get(name, []))
    report(ctx, partial, range(3, 5), latency=10.0)  # the fifth probe: the baseline exists from now on
    assert one(scrape(ctx), "trimtab_job_collective_latency_baseline_seconds", **part_l) == pytest.approx(10e-6)


def test_decisions_and_changes_are_counters_of_settled_outcomes(ctx):
    job = register(ctx, ranks=1)
    report(ctx, job, range(4))
    other = register(ctx, name="other", ranks=1, mode="advise")
    e = ctx.engine
    for outcome in ("advised", "advised", "kept", "rolled_back"):
        decision_store.add_decision(e, job.id, "generation_bound", {}, outcome=outcome)
    decision_store.add_decision(e, job.id, "fragmentation", {}, outcome="kept")
    decision_id, change = decision_store.decide_change(e, job.id, "evaluation_bound", {}, "prefetch", 4, "r")
    decision_store.add_decision(e, other.id, "pcie", {}, outcome="advised")  # a job not reporting: counted too
    manual = change_store.queue_change(e, other.id, "prefetch", 1, "op")
    change_store.ack_change(e, other.id, manual.id, 0, 7)
    got = scrape(ctx)
    decided = {(lab["job"], lab["rule"], lab["outcome"]): v for lab, v in got["trimtab_rebalancer_decisions_total"]}
    assert decided == {("grpo", "generation_bound", "advised"): 2, ("grpo", "generation_bound", "kept"): 1,
                       ("grpo", "generation_bound", "rolled_back"): 1, ("grpo", "fragmentation", "kept"): 1,
                       ("other", "pcie", "advised"): 1}
    changed = {(lab["job"], lab["source"], lab["status"]): v for lab, v in got["trimtab_rebalancer_changes_total"]}
    assert changed == {("other", "manual", "applied"): 1}
    assert one(got, "trimtab_rebalancer_decisions_pending", job="grpo", mode="auto") == 1
    assert one(got, "trimtab_rebalancer_changes_pending", job="grpo", mode="auto") == 1
    assert of(got, "trimtab_rebalancer_decisions_pending", job="other") == {}  # gauges: live jobs only

    # the change is applied and the decision kept: the counters move up, the pending gauges to 0
    change_store.ack_change(e, job.id, change.id, 0, 4)
    decision_store.close_decision(e, decision_id, "kept", {})
    got = scrape(ctx)
    decided = {(lab["job"], lab["rule"], lab["outcome"]): v for lab, v in got["trimtab_rebalancer_decisions_total"]}
    assert decided[("grpo", "evaluation_bound", "kept")] == 1
    changed = {(lab["job"], lab["source"], lab["status"]): v for lab, v in got["trimtab_rebalancer_changes_total"]}
    assert changed == {("other", "manual", "applied"): 1, ("grpo", "rebalancer", "applied"): 1}
    assert one(got, "trimtab_rebalancer_decisions_pending", job="grpo", mode="auto") == 0
    assert one(got, "trimtab_rebalancer_changes_pending", job="grpo", mode="auto") == 0


def test_jobs_silent_for_ten_minutes_have_no_gauges(ctx, monkeypatch):
    job = register(ctx, ranks=1)
    eleven_minutes_ago = int(time.time() * 1000) - 11 * 60_000
    monkeypatch.setattr(job_store, "now_ms", lambda: eleven_minutes_ago)
    report(ctx, job, range(6))
    monkeypatch.undo()
    decision_store.add_decision(ctx.engine, job.id, "generation_bound", {}, outcome="advised")
    got = scrape(ctx)
    assert not any(name in got for name in GAUGES)
    assert [(lab["job"], v) for lab, v in got["trimtab_rebalancer_decisions_total"]] == [("grpo", 1.0)]


def count_queries(ctx) -> int:
    """SELECTs sent to the store by one scrape."""
    counted = []

    def before(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("SELECT"):
            counted.append(statement)

    event.listen(ctx.engine, "before_cursor_execute", before)
    try:
        render_metrics(ctx)
    finally:
        event.remove(ctx.engine, "before_cursor_execute", before)
    return len(counted)


def test_queries_per_scrape_do_not_grow_with_the_number_of_jobs(make_ctx):
    counts = {}
    for n in (1, 6):
        ctx = make_ctx()
        Feeder(ctx).simulated(hostname="sim-a", n_gpus=2, ticks=1)
        for i in range(n):
            job = register(ctx, name=f"job{i}")
            report(ctx, job, range(8), latency=10.0)
            decision_store.add_decision(ctx.engine, job.id, "generation_bound", {}, outcome="advised")
        first = count_queries(ctx)   # the probe baselines are read once …
        second = count_queries(ctx)  # … and kept: they never change
        assert len(scrape(ctx)["trimtab_job_samples_per_second"]) == n
        counts[n] = (first, second)
    assert counts[1] == counts[6], counts
    first, second = counts[6]
    # jobs, their newest steps, the baselines (first scrape only), simulated nodes, three counts (decisions,
    # changes, failed plans), GPU aggregates; the GPU-time ledger: simulated nodes, the accumulated cells (read
    # only: the ledger's ticker advances them, never a scrape)
    assert (first, second) == (10, 9), counts


def test_the_learning_signals_a_job_reports_are_exported_as_window_means_and_absent_ones_are_no_series(ctx):
    job = register(ctx, name="learner", ranks=1)
    for step, (reward, clip) in enumerate([(0.1, 0.05), (0.3, 0.07), (0.5, 0.09), (0.7, 0.11)]):
        assert job_store.add_report(ctx.engine, job.id, dict(step=step, rank=0, step_time_s=2.0, samples=8,
                                                             learning_reward=reward, learning_clip_fraction=clip))
    got = scrape(ctx)
    series = of(got, "trimtab_job_learning_signal", job="learner")
    # the window: the newest 4 s of steps (steps 2–3, two 2-s steps)
    assert series == {frozenset({("mode", "auto"), ("signal", "reward")}): pytest.approx(0.6),
                      frozenset({("mode", "auto"), ("signal", "clip_fraction")}):
                          pytest.approx(0.10)}  # kl, ess, … never reported: no series, not 0
