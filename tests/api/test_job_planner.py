"""What the rebalancer last said about a job, on the job's API and /healthz (issue 38): a job whose plans raise is
``planner.failing`` with the error, the stage, the step, since when and when it is tried again, and /healthz is
degraded naming it (200: the API serves); recovered, it says so; a plan that decided nothing names its gate, the
window, what it misses and the step at which it expects to decide."""

from __future__ import annotations

from trimtab.control import service as service_mod
from trimtab.control.service import Rebalancer
from trimtab.store.jobs import get_job

JOB = {"name": "grpo", "ranks": 1, "hostnames": ["node-a"], "mode": "auto",
       "knobs": {"batch_size": {"value": 1, "min": 1, "max": 64}}}


def report(api, step: int, step_time: float = 45.0, gen: float = 44.0) -> None:
    r = api.post("/v1/jobs/grpo/reports", {"step": step, "rank": 0, "step_time_s": step_time, "samples": 64,
                                           "phases": {"generation": gen, "evaluation": 0.5, "communication": 0.2,
                                                      "update": max(0.0, step_time - gen - 0.7), "other": 0.0}},
                 scope="job")
    assert r.status_code == 200, r.text


def test_a_job_whose_plans_fail_says_so_on_its_api_and_healthz_until_it_recovers(api, monkeypatch):
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    assert api.get("/v1/jobs/grpo").json()["planner"] is None  # never planned
    report(api, 0)
    monkeypatch.setattr(service_mod, "plan", lambda *a, **k: 1 / 0)
    rb = Rebalancer(api.ctx.engine, api.ctx.rules)
    assert rb.evaluate(get_job(api.ctx.engine, "grpo")) is None

    planner = api.get("/v1/jobs/grpo").json()["planner"]
    assert planner["failing"] is True and planner["failures"] == 1 and planner["errors_total"] == 1
    err = planner["last_error"]
    assert (err["type"], err["message"], err["stage"], err["step"]) == \
        ("ZeroDivisionError", "division by zero", "planning", 0)
    assert planner["failing_since_ms"] == err["at_ms"] and planner["retry_at_ms"] == err["at_ms"] + 1000
    assert [e["kind"] for e in planner["events"]] == ["planning_failed"]
    assert api.get("/v1/jobs").json()["jobs"][0]["planner"]["failing"] is True
    [checked] = api.get("/v1/balance/jobs").json()["jobs"]  # what `check --server` renders
    assert checked["planner"]["failing"] is True and checked["planner"]["last_error"]["stage"] == "planning"

    health = api.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    [failure] = health.json()["planning_failures"]
    assert failure["job"] == "grpo" and failure["failures"] == 1
    assert failure["error"].startswith("ZeroDivisionError: division by zero (while planning, step 0; control/")

    monkeypatch.undo()
    assert rb.evaluate(get_job(api.ctx.engine, "grpo")).change is not None
    planner = api.get("/v1/jobs/grpo").json()["planner"]
    assert planner["failing"] is False and planner["retry_at_ms"] is None and planner["errors_total"] == 1
    assert planner["note"].startswith("generation_bound") and planner["gate"] is None  # it decided
    assert [e["kind"] for e in planner["events"]] == ["planning_recovered", "planning_failed"]
    assert api.get("/healthz").json()["status"] == "ok"


def test_a_plan_that_decided_nothing_names_its_gate_and_the_step_it_expects(api):
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    report(api, 0, step_time=1.0, gen=0.9)  # 1 s steps: a window is 4 s
    Rebalancer(api.ctx.engine, api.ctx.rules).evaluate(get_job(api.ctx.engine, "grpo"))
    planner = api.get("/v1/jobs/grpo").json()["planner"]
    assert planner["failing"] is False and planner["step"] == 0 and planner["note"].startswith("collecting a window")
    gate = planner["gate"]
    assert gate["name"] == "collecting_steps" and gate["expects_step"] == 3, gate
    assert gate["missing"].startswith("3.0 s more of step time") and gate["window"]["steps"] == [0, 0]
