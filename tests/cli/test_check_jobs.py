"""The job rows of `trimtab check` (step composition, fragmentation, collective latency), graded from real step
reports in a real store by the rules, and the check's job sections: text, --json, exit codes, --server."""

from __future__ import annotations

import json
import time
from typing import Optional

import pytest
from click.testing import CliRunner

from trimtab.agent.sampler import Sampler
from trimtab.agent.simulated import SimulatedNode
from trimtab.cli.main import cli
from trimtab.grading.job_report import job_summary, job_verdicts, live_job_summaries
from trimtab.grading.rules import load_rules
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate

RULES = load_rules()
KNOBS = {"batch_size": {"value": 4, "min": 1, "max": 64}, "prefetch": {"value": 0, "min": 0, "max": 8},
         "sync_every": {"value": 1, "min": 1, "max": 8}}
JOB_CHECKS = ("step_composition", "fragmentation", "collective_latency")




@pytest.fixture
def engine(store_engine):
    """A migrated store on SQLite and on PostgreSQL (the shared ``store_engine`` fixture)."""
    return store_engine


@pytest.fixture
def db(tmp_path):
    """A migrated SQLite store for the command line: (url, engine)."""
    url = f"sqlite:///{tmp_path}/cli.db"
    engine = open_engine(url)
    migrate(engine)
    yield url, engine
    engine.dispose()


def register(engine, name="grpo", ranks=1, hostnames=("sim-a",), mode="advise", rules=None):
    job, _ = job_store.register_job(engine, name, ranks, {"actor": [0], "critic": [1]}, list(hostnames), KNOBS,
                                    mode, None, True, rules=rules)
    return job


def report(engine, job, steps, step_time=1.0, gen: Optional[float] = 0.3, ev: Optional[float] = 0.2,
           comm: Optional[float] = 0.05, samples: Optional[int] = 8, frag: Optional[float] = None,
           latency: Optional[float] = None, retries: Optional[int] = None, ranks=None) -> None:
    """One report per rank for each step; phases given as shares of ``step_time``."""
    def s(share):
        return None if share is None else share * step_time

    for step in steps:
        for rank in ranks if ranks is not None else range(job.ranks):
            assert job_store.add_report(engine, job.id, dict(
                step=step, rank=rank, step_time_s=step_time, generation_s=s(gen), evaluation_s=s(ev),
                communication_s=s(comm), update_s=None if gen is None else step_time - s(gen) - s(ev) - s(comm),
                other_s=0.0, samples=samples, fragmentation=frag, collective_latency_us=latency,
                num_alloc_retries=retries))


def rows(engine, job, rules=RULES) -> dict:
    return {v.check: v for v in job_verdicts(engine, job_store.get_job(engine, job.name), rules)}


# -- the rows, from stored reports ----------------------------------------------------------------------------


def test_a_generation_heavy_job_acts_on_step_composition(engine):
    job = register(engine, ranks=2)
    report(engine, job, range(8), step_time=2.0, gen=0.8, ev=0.1, comm=0.05)
    v = rows(engine, job)["step_composition"]
    assert (v.status, v.unit, v.healthy_below, v.act_above) == ("act", "% of step", 45.0, 50.0)
    assert v.value == pytest.approx(80.0)
    for text in ("generation-bound", "generation 80.0 % ACT (guide < 45, act > 50)",
                 "evaluation 10.0 % (guide < 30, act > 50)", "communication 5.0 % (guide < 15, act > 15)",
                 "steps 6–7", "8.00 samples/s"):
        assert text in v.message, (text, v.message)
    assert v.advice == RULES["generation_bound"].advice
    s = job_summary(engine, job_store.get_job(engine, "grpo"), RULES)
    # The controller's window: the newest steps covering 4 s (two 2-s steps); both ranks' samples add up.
    assert (s.window_steps, s.n_steps, s.full_window) == ([6, 7], 2, True)
    assert s.samples_per_s == pytest.approx(16 / 2.0) and s.step_time_s == pytest.approx(2.0)
    assert s.phase_shares["generation"] == pytest.approx(0.8) and s.phase_shares["update"] == pytest.approx(0.05)
    assert s.status == "act"


@pytest.mark.parametrize("shares, status, phase, value", [
    ((0.40, 0.25, 0.10), "ok", "generation", 40.0),          # each phase inside its guide
    ((0.47, 0.20, 0.05), "watch", "generation", 47.0),       # over the 45 % guide, under the 50 % act line
    ((0.40, 0.35, 0.10), "watch", "evaluation", 35.0),       # evaluation's own guide is 30 %
    ((0.20, 0.60, 0.05), "act", "evaluation", 60.0),
    ((0.30, 0.20, 0.25), "act", "communication", 25.0),      # communication acts above 15 %
])
def test_each_phase_is_graded_by_its_own_rule(engine, shares, status, phase, value):
    job = register(engine)
    gen, ev, comm = shares
    report(engine, job, range(6), gen=gen, ev=ev, comm=comm)
    v = rows(engine, job)["step_composition"]
    rule = RULES[f"{phase}_bound"]
    assert (v.status, v.value, v.healthy_below, v.act_above) == (status, pytest.approx(value), rule.healthy_below,
                                                                 rule.act_above)
    assert v.message.startswith(f"{phase}-bound: ") == (status == "act")
    assert (v.advice == rule.advice) == (status != "ok")


def test_one_burst_does_not_act_the_whole_window_must(engine):
    """The controller's hysteresis: above the line over the window but not over each half of it → watch."""
    job = register(engine)
    report(engine, job, range(0, 4), gen=0.2)
    report(engine, job, range(4, 6), gen=0.9)
    report(engine, job, range(6, 8), gen=0.2)
    report(engine, job, range(8, 10), gen=0.9)  # window 6–9: 55 % over the whole, 20 % in its first half
    v = rows(engine, job)["step_composition"]
    assert v.value == pytest.approx(55.0) and v.status == "watch"
    report(engine, job, range(10, 12), gen=0.9)  # window 8–11: 90 % throughout
    assert rows(engine, job)["step_composition"].status == "act"


@pytest.mark.parametrize("frag, status", [(0.30, "act"), (0.20, "watch"), (0.05, "ok"), (None, "no_data")])
def test_fragmentation_row(engine, frag, status):
    job = register(engine)
    report(engine, job, range(6), frag=frag, retries=None if frag is None else 0)
    v = rows(engine, job)["fragmentation"]
    assert (v.status, v.unit, v.healthy_below, v.act_above) == (status, "%", 15.0, 25.0)
    if frag is None:
        assert v.value is None and "no allocator statistics" in v.message
    else:
        assert v.value == pytest.approx(100 * frag) and "0 allocator retries in the window" in v.message
        assert ("only under memory pressure" in v.message) == (status == "act")


def test_collective_latency_against_the_median_of_the_first_five_probes(engine):
    job = register(engine)
    for step, us in enumerate([10.0, 10.0, 10.0, 10.0, 60.0]):  # median 10 µs (the mean would be 20 µs)
        report(engine, job, [step], latency=us)
    report(engine, job, range(5, 9), latency=25.0)
    v = rows(engine, job)["collective_latency"]
    assert (v.status, v.unit, v.healthy_below, v.act_above) == ("act", "× baseline", 1.5, 2.0)
    assert v.value == pytest.approx(2.5)
    assert "window mean 25.0 µs vs baseline 10.0 µs" in v.message
    s = job_summary(engine, job_store.get_job(engine, "grpo"), RULES)
    assert (s.probe_baseline_us, s.collective_latency_us) == (pytest.approx(10.0), pytest.approx(25.0))
    report(engine, job, range(9, 13), latency=14.0)
    assert rows(engine, job)["collective_latency"].status == "ok"  # 1.4 × baseline


def test_collective_latency_needs_a_baseline_and_probes_in_the_window(engine):
    job = register(engine)
    report(engine, job, range(4), latency=10.0)  # four probes: the baseline needs five
    v = rows(engine, job)["collective_latency"]
    assert v.status == "no_data" and v.value is None and "no baseline yet (fewer than 5 probes" in v.message
    report(engine, job, range(4, 10))  # the probe stops
    v = rows(engine, job)["collective_latency"]
    assert v.status == "no_data" and "no collective-latency probes in the window" in v.message


def test_no_step_reports_yet(engine):
    job = register(engine)
    got = rows(engine, job)
    assert list(got) == list(JOB_CHECKS)
    assert all(v.status == "no_data" and v.message == "no step reports yet" and v.value is None
               for v in got.values())


def test_a_step_counts_once_every_rank_reported_it_and_the_slowest_rank_sets_the_phase(engine):
    job = register(engine, ranks=2)
    for step in range(5):
        report(engine, job, [step], step_time=2.0, gen=0.25, ranks=[0])
        report(engine, job, [step], step_time=2.0, gen=0.9, ev=0.05, comm=0.02, ranks=[1])
    report(engine, job, [5], step_time=2.0, gen=0.1, ranks=[0])  # rank 1 has not reported step 5 yet
    s = job_summary(engine, job_store.get_job(engine, "grpo"), RULES)
    assert s.window_steps == [3, 4]
    assert s.phase_shares["generation"] == pytest.approx(0.9)
    assert s.samples_per_s == pytest.approx(16 / 2.0)
    assert s.verdicts[0].status == "act"


def test_the_window_follows_the_jobs_own_rules(engine):
    default = register(engine, name="default")
    short = register(engine, name="short", rules={"controller": {"window_min_s": 2.0}})
    for job in (default, short):
        report(engine, job, range(10))
    assert job_summary(engine, job_store.get_job(engine, "default"), RULES).window_steps == [6, 9]
    assert job_summary(engine, job_store.get_job(engine, "short"), RULES).window_steps == [8, 9]


def test_a_short_history_is_graded_and_says_so(engine):
    job = register(engine)
    report(engine, job, range(2), gen=0.9)  # 2 s of steps; the controller's window needs 4 s
    s = job_summary(engine, job_store.get_job(engine, "grpo"), RULES)
    assert (s.window_steps, s.full_window) == ([0, 1], False)
    assert s.verdicts[0].status == "act" and "only 2 steps, 2.0 s so far" in s.verdicts[0].message


def test_the_summary_lists_knobs_mode_and_the_last_five_decisions(engine):
    job = register(engine, mode="auto")
    report(engine, job, range(6))
    for i in range(6):
        decision_store.add_decision(engine, job.id, "generation_bound", {}, knob="batch_size", old_value=i,
                                    new_value=i + 1, outcome="kept", ts_ms=1_000 + i,
                                    throughput_before_samples_per_s=1.0, throughput_after_samples_per_s=2.0)
    decision_store.add_decision(engine, job.id, "utilization_spread", {}, outcome="advised", ts_ms=2_000)
    s = job_summary(engine, job_store.get_job(engine, "grpo"), RULES)
    assert s.mode == "auto" and s.knobs == KNOBS
    assert [(d.rule, d.change, d.outcome) for d in s.decisions] == [
        ("utilization_spread", "advice only", "advised"), ("generation_bound", "batch_size 5 → 6", "kept"),
        ("generation_bound", "batch_size 4 → 5", "kept"), ("generation_bound", "batch_size 3 → 4", "kept"),
        ("generation_bound", "batch_size 2 → 3", "kept")]
    d = s.to_dict()
    assert d["status"] == "ok" and d["decisions"][1]["change"] == "batch_size 5 → 6"


def test_only_jobs_that_reported_recently_are_live(engine, monkeypatch):
    old = register(engine, name="old")
    fresh = register(engine, name="fresh")
    eleven_minutes_ago = int(time.time() * 1000) - 11 * 60_000
    monkeypatch.setattr(job_store, "now_ms", lambda: eleven_minutes_ago)
    report(engine, old, range(6))
    monkeypatch.undo()
    report(engine, fresh, range(6))
    assert [s.name for s in live_job_summaries(engine, 30, RULES)] == ["fresh"]
    assert [s.name for s in live_job_summaries(engine, 15 * 60, RULES)] == ["fresh", "old"]


# -- trimtab check ----------------------------------------------------------------------------------------------


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def node_samples(engine, hostname="sim-a", scenario="balanced", ticks=3) -> None:
    writer = BatchWriter(engine)
    sampler = Sampler([SimulatedNode(2, scenario, hostname=hostname)], writer.write, hostname=hostname)
    for _ in range(ticks):
        sampler.tick()


def test_check_shows_each_job_and_an_act_row_is_an_imbalance(db):
    url, engine = db
    node_samples(engine)
    job = register(engine, name="grpo-7b", mode="auto")
    report(engine, job, range(6), gen=0.8, frag=0.1, retries=0)
    decision_store.add_decision(engine, job.id, "generation_bound", {}, knob="batch_size", old_value=1,
                                new_value=4, outcome="kept", applied_step=3, throughput_before_samples_per_s=2.0,
                                throughput_after_samples_per_s=8.0)
    res = run("check", "--db", url)
    assert res.exit_code == 1, res.output
    out = res.stdout
    node, jobs = out.split("\njob grpo-7b", 1)
    assert "node sim-a" in node and "verdict: BALANCED" in node
    assert "no job data" not in out and "step_composition" not in node
    assert "mode auto" in jobs and "[SIMULATED node]" in jobs
    assert "knobs: batch_size 4 (1–64), prefetch 0 (0–8), sync_every 1 (1–8)" in jobs
    assert "8.00 samples/s" in jobs
    assert "ACT   step_composition     generation-bound: generation 80.0 % ACT" in jobs
    assert "ok    fragmentation" in jobs and "-     collective_latency" in jobs
    assert "generation_bound     batch_size 1 → 4" in jobs and "kept at step 3  2.00 → 8.00 samples/s" in jobs
    section, overall = jobs.rstrip().rsplit("\n\n", 1)
    assert section.endswith("verdict: OUT OF BALANCE")
    assert overall == "overall: OUT OF BALANCE (job grpo-7b); exit 1"


def test_a_healthy_job_keeps_exit_0(db):
    url, engine = db
    node_samples(engine)
    report(engine, register(engine), range(6), gen=0.3, frag=0.05, retries=0)
    res = run("check", "--db", url)
    assert res.exit_code == 0, res.output
    assert "job grpo" in res.stdout and "recent decisions: none" in res.stdout
    assert res.stdout.count("verdict: BALANCED") == 2
    assert res.stdout.rstrip().splitlines()[-1] == "overall: BALANCED; exit 0"


def test_the_last_line_is_the_overall_verdict_a_node_out_of_balance_above_a_balanced_job(db):
    url, engine = db
    node_samples(engine, scenario="pcie-saturated")
    report(engine, register(engine), range(6), gen=0.3, frag=0.05, retries=0)
    res = run("check", "--db", url)
    assert res.exit_code == 1, res.output
    node, job = res.stdout.split("\njob grpo", 1)
    assert node.rstrip().endswith("verdict: OUT OF BALANCE") and "verdict: BALANCED" in job  # each its own
    assert res.stdout.rstrip().splitlines()[-1] == "overall: OUT OF BALANCE (node sim-a); exit 1"


def test_check_json_has_the_jobs(db):
    url, engine = db
    node_samples(engine)
    job = register(engine, ranks=2)
    report(engine, job, range(6), step_time=2.0, gen=0.2, ev=0.6, frag=0.3, retries=0)
    res = run("check", "--db", url, "--json")
    assert res.exit_code == 1, res.output
    body = json.loads(res.stdout)
    assert body["status"] == "act" and body["balanced"] is False and body["simulated"] is True
    assert [v["check"] for v in body["nodes"][0]["verdicts"]] == ["utilization_spread", "pcie", "memory"]
    [j] = body["jobs"]
    assert (j["name"], j["mode"], j["ranks"], j["status"], j["window_steps"]) == ("grpo", "advise", 2, "act", [4, 5])
    assert j["knobs"] == KNOBS and j["samples_per_s"] == pytest.approx(8.0)
    assert j["phase_shares"]["evaluation"] == pytest.approx(0.6)
    got = {v["check"]: (v["status"], v["value"]) for v in j["verdicts"]}
    assert got == {"step_composition": ("act", pytest.approx(60.0)), "fragmentation": ("act", pytest.approx(30.0)),
                   "collective_latency": ("no_data", None)}
    assert j["decisions"] == []


def test_without_jobs_the_node_keeps_its_no_job_data_rows(db):
    url, engine = db
    node_samples(engine)
    body = json.loads(run("check", "--db", url, "--json").stdout)
    assert body["jobs"] == []
    rows_ = {v["check"]: v for v in body["nodes"][0]["verdicts"]}
    assert all(rows_[c]["status"] == "no_data" and "no job data" in rows_[c]["message"] for c in JOB_CHECKS)


def test_a_job_silent_for_over_ten_minutes_is_left_out_unless_the_window_covers_it(db, monkeypatch):
    url, engine = db
    node_samples(engine)
    job = register(engine)
    twelve_minutes_ago = int(time.time() * 1000) - 12 * 60_000
    monkeypatch.setattr(job_store, "now_ms", lambda: twelve_minutes_ago)
    report(engine, job, range(6), gen=0.9)
    monkeypatch.undo()
    res = run("check", "--db", url)
    assert res.exit_code == 0 and "job grpo" not in res.stdout and "no job data" in res.stdout
    res = run("check", "--db", url, "--window", "900")
    assert res.exit_code == 1 and "job grpo" in res.stdout and "12 min ago" in res.stdout


def test_node_filter_shows_the_jobs_on_that_node(db):
    url, engine = db
    node_samples(engine, hostname="sim-a")
    node_samples(engine, hostname="sim-b")
    report(engine, register(engine, name="on-a", hostnames=["sim-a"]), range(6))
    report(engine, register(engine, name="on-b", hostnames=["sim-b"]), range(6), gen=0.9)
    body = json.loads(run("check", "--db", url, "--node", "sim-a", "--json").stdout)
    assert [j["name"] for j in body["jobs"]] == ["on-a"] and body["status"] == "ok"
    res = run("check", "--db", url, "--json")
    assert [j["name"] for j in json.loads(res.stdout)["jobs"]] == ["on-a", "on-b"] and res.exit_code == 1


def test_jobs_without_node_samples_are_still_graded(db):
    url, engine = db
    report(engine, register(engine), range(6), gen=0.9)
    res = run("check", "--db", url)
    assert res.exit_code == 1, res.output
    assert "showing the jobs only" in res.stderr and "job grpo" in res.stdout and "node " not in res.stdout


def test_rules_file_changes_the_grade(db, tmp_path):
    url, engine = db
    node_samples(engine)
    report(engine, register(engine), range(6), gen=0.8)
    rules = tmp_path / "rules.toml"
    rules.write_text("[rules.generation_bound]\nhealthy_below = 60.0\nact_above = 90.0\n")
    res = run("check", "--db", url, "--rules-file", str(rules), "--json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)["jobs"][0]["verdicts"][0]
    assert (v["status"], v["act_above"]) == ("watch", 90.0)
    rules.write_text("[rules.generation_bound]\nact_above = \"high\"\n")
    res = run("check", "--db", url, "--rules-file", str(rules))
    assert res.exit_code == 2 and "rules rejected" in res.stderr


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api(request, make_api):
    """The real app on loopback (tests/api/conftest.py), over each backend."""
    return make_api("sqlite" if request.param == "sqlite" else request.getfixturevalue("pg_url"))


def test_server_mode_shows_the_same_jobs(api):
    from tests.api.conftest import SIM_NODE, recent_batch

    assert api.ingest(recent_batch(SIM_NODE)).status_code == 200
    engine = api.ctx.engine
    job = register(engine, name="grpo-7b", ranks=2, hostnames=[SIM_NODE.hostname], mode="auto")
    report(engine, job, range(8), step_time=2.0, gen=0.8, frag=0.1, retries=0, latency=12.0)
    decision_store.add_decision(engine, job.id, "generation_bound", {}, knob="batch_size", old_value=1,
                                new_value=4, outcome="pending")
    res = run("check", "--server", api.url, "--json")
    assert res.exit_code == 1, res.output
    body = json.loads(res.stdout)
    [j] = body["jobs"]
    [local] = live_job_summaries(engine, 30.0, api.ctx.rules)
    expected = local.to_dict()
    for key in ("generated_at_ms",):
        j.pop(key), expected.pop(key)
    assert j == json.loads(json.dumps(expected))
    assert [v["check"] for v in body["nodes"][0]["verdicts"]] == ["utilization_spread", "pcie", "memory"]
    assert {v["check"]: v["status"] for v in j["verdicts"]} == {
        "step_composition": "act", "fragmentation": "ok", "collective_latency": "ok"}
    assert j["decisions"][0]["change"] == "batch_size 1 → 4" and j["decisions"][0]["outcome"] == "pending"
    text = run("check", "--server", api.url).stdout
    assert "job grpo-7b  mode auto  ranks 2" in text and "ACT   step_composition" in text
    jobs = api.get("/v1/balance/jobs").json()
    assert jobs["status"] == "act" and jobs["simulated"] is True and [x["name"] for x in jobs["jobs"]] == ["grpo-7b"]
