"""`trimtab check` says what the rebalancer last said about each job (issue 38): the job line says the planner fails
on it and why, with since when and the retry; a rule at ACT with "recent decisions: none" gets the gate that held
it, the window and the step at which the planner expects to decide (or "not before the job moves")."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.control import service as service_mod
from trimtab.control.service import Rebalancer
from trimtab.store import jobs as job_store
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate

KNOBS = {"batch_size": {"value": 4, "min": 1, "max": 64}}


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path}/cli.db"
    engine = open_engine(url)
    migrate(engine)
    yield url, engine
    engine.dispose()


def job_with_steps(engine, step_times) -> job_store.StoredJob:
    """A generation-bound job (80 % of each step) in mode auto, one rank, one report per step."""
    job, _ = job_store.register_job(engine, "grpo", 1, {}, ["node-a"], KNOBS, "auto", None, True)
    for step, t in enumerate(step_times):
        assert job_store.add_report(engine, job.id, dict(
            step=step, rank=0, step_time_s=t, generation_s=0.8 * t, evaluation_s=0.1 * t, communication_s=0.02 * t,
            update_s=0.08 * t, other_s=0.0, samples=8))
    return job_store.get_job(engine, "grpo")


def check(url, *args):
    return CliRunner().invoke(cli, ["check", "--db", url, *args], catch_exceptions=False)


def test_the_job_line_says_the_planner_fails_on_it_and_why(db, monkeypatch):
    url, engine = db
    job = job_with_steps(engine, [1.0] * 8)
    monkeypatch.setattr(service_mod, "plan", lambda *a, **k: 1.0 / 0.0)
    assert Rebalancer(engine).evaluate(job) is None
    res = check(url)
    head = next(line for line in res.stdout.splitlines() if line.startswith("job grpo"))
    assert head.endswith("— THE PLANNER FAILS ON THIS JOB: ZeroDivisionError: float division by zero"), head
    assert "planner: fails on this job (1 in a row, the first 0 s ago, planned again in 1 s): ZeroDivisionError: " \
           "float division by zero (while planning, step 7; control/service.py:" in res.stdout
    assert "trimtab check: the planner fails on job 'grpo': ZeroDivisionError" in res.stderr
    [j] = json.loads(check(url, "--json").stdout)["jobs"]
    assert j["planner"]["failing"] is True and j["planner"]["last_error"]["type"] == "ZeroDivisionError"


def test_a_rule_at_act_without_decisions_says_which_gate_holds_it(db):
    # The drift of issue 38: step times grow 1 % a step (the responses grow); generation is 80 % of every step.
    url, engine = db
    job = job_with_steps(engine, [1.0 + 0.01 * i for i in range(40)])
    p = Rebalancer(engine).evaluate(job)
    assert p is not None and p.gate is not None and p.gate.name == "settling", p and p.note
    res = check(url)
    assert res.exit_code == 1, res.output
    out = res.stdout
    assert "ACT   step_composition" in out and "recent decisions: none" in out
    assert "planner (0 s ago, at step 39): generation_bound fires; waiting for the throughput to settle" in out
    window = p.gate.window["steps"]
    assert (f"  held: settling (generation_bound); window steps {window[0]}–{window[1]}, "
            in out) and "; not before the job moves" in out
    [j] = json.loads(check(url, "--json").stdout)["jobs"]
    assert j["planner"]["gate"]["name"] == "settling" and j["planner"]["gate"]["expects_step"] is None
