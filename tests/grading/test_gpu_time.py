"""Step composition on GPU time (issue 22): where every step of a window carries its phases' GPU time (the hook's
CUDA events), the composition row, the rules, the decision evidence, /v1/balance/jobs and /metrics grade on it;
where not, on wall time exactly as before. The loop of the issue: evaluation launches its kernels and returns
(wall 0 %), the update's ``loss.item()`` waits (wall 80 %) — on GPU time evaluation is 60 %."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trimtab.api.metrics import render_metrics
from trimtab.contract.step_report import to_columns
from trimtab.grading.grading import COMPOSITION, job_rows
from trimtab.grading.rules import default_rules
from trimtab.grading.signals import GPU_TIME, WALL_TIME, JobContext, job_reading, phase_share_pct, time_base
from trimtab.grading.window import JobStep, fold_step, throughput

WALL = {"generation": 0.2, "evaluation": 0.0, "update": 0.8, "other": 0.0}  # the async loop, as Python sees it
GPU = {"generation": 0.2, "evaluation": 0.6, "update": 0.2}                  # what the GPU did


def wire(step: int, gpu: bool = True, wait_s: float | None = None) -> dict:
    phases = dict(WALL, **({"wait": wait_s} if wait_s is not None else {}))
    body = {"step": step, "rank": 0, "step_time_s": 1.0 + (wait_s or 0.0), "samples": 8, "phases": phases}
    if gpu:
        body["gpu_phases"] = dict(GPU)
    return body


def steps(n: int = 8, gpu: bool = True, **kw) -> list[JobStep]:
    out = []
    for i in range(n):
        row = to_columns(wire(i, gpu, **kw))
        row["received_ms"] = 1_000_000 + 1000 * i
        out.append(fold_step(i, [row]))
    return out


def composition(win: list[JobStep]):
    ctx = JobContext(all_steps=win, probe_baseline_us=None)
    return job_rows(default_rules(), win, ctx, throughput(win), None)[0]


def test_the_window_is_graded_on_gpu_time_where_every_step_has_it():
    win = steps()
    assert time_base(win) == GPU_TIME
    row = composition(win)
    assert row.check == COMPOSITION and row.status == "act"
    assert row.message.startswith("evaluation-bound") and "on GPU time" in row.message, row.message
    assert phase_share_pct(win, "evaluation") == pytest.approx(60.0)
    assert phase_share_pct(win, "update") == pytest.approx(20.0)
    assert phase_share_pct(win, "other") == pytest.approx(0.0)
    rule = next(r for r in default_rules().rules if r.name == "evaluation_bound")
    reading = job_reading(rule, win, JobContext(all_steps=win, probe_baseline_us=None))
    assert reading.fires and reading.evidence()["time_base"] == GPU_TIME  # what a decision records
    assert reading.per_step == [pytest.approx(60.0)] * len(win)


def test_without_gpu_time_nothing_changes():
    win = steps(gpu=False)
    assert time_base(win) == WALL_TIME
    row = composition(win)
    assert row.message.startswith("update-bound") and "on wall time" in row.message, row.message
    for phase, seconds in WALL.items():  # the wall shares, as they were: phase seconds over step seconds
        assert phase_share_pct(win, phase) == pytest.approx(100.0 * seconds)
    rule = next(r for r in default_rules().rules if r.name == "update_bound")
    assert job_reading(rule, win, JobContext(all_steps=win, probe_baseline_us=None)).fires


def test_one_step_without_gpu_time_puts_the_whole_window_on_wall_time():
    win = steps()
    mixed = win[:3] + steps(gpu=False)[3:4] + win[4:]
    assert time_base(mixed) == WALL_TIME
    assert composition(mixed).message.startswith("update-bound")


def test_waiting_for_rollout_keeps_its_wall_time_on_a_gpu_window():
    win = steps(wait_s=1.0)  # steps of 2 s: 1 s of GPU work, 1 s waiting for a batch
    assert time_base(win) == GPU_TIME
    assert phase_share_pct(win, "wait") == pytest.approx(50.0)
    assert phase_share_pct(win, "evaluation") == pytest.approx(30.0)
    assert "on GPU time for generation, evaluation, update; wall time for wait;" in composition(win).message


def test_the_api_stores_grades_and_exports_gpu_time(sqlite_api):
    api = sqlite_api
    for name, gpu in (("async-loop", True), ("host-timed", False)):
        assert api.post("/v1/jobs", {"name": name, "ranks": 1, "mode": "advise"}, scope="job").status_code == 201
        for i in range(8):
            r = api.post(f"/v1/jobs/{name}/reports", wire(i, gpu), scope="job")
            assert r.status_code == 200, r.text
    stored = api.get("/v1/jobs/async-loop/reports", limit=1).json()["reports"][0]
    assert (stored["gpu_evaluation_s"], stored["evaluation_s"]) == (0.6, 0.0)
    assert api.get("/v1/jobs/host-timed/reports", limit=1).json()["reports"][0]["gpu_evaluation_s"] is None
    jobs = {j["name"]: j for j in api.get("/v1/balance/jobs", window=30).json()["jobs"]}
    gpu_job, wall_job = jobs["async-loop"], jobs["host-timed"]
    assert gpu_job["time_base"] == "gpu" and wall_job["time_base"] == "wall"
    assert gpu_job["phase_shares"]["evaluation"] == pytest.approx(0.6)
    assert gpu_job["wall_phase_shares"]["evaluation"] == pytest.approx(0.0)
    assert gpu_job["verdicts"][0]["message"].startswith("evaluation-bound")
    assert wall_job["verdicts"][0]["message"].startswith("update-bound")
    assert wall_job["phase_shares"] == wall_job["wall_phase_shares"]
    families = {f.name: f for f in text_string_to_metric_families(render_metrics(api.ctx).decode())}
    on_gpu = {s.labels["job"]: s.value for s in families["trimtab_job_composition_gpu_time"].samples}
    assert on_gpu == {"async-loop": 1.0, "host-timed": 0.0}
    wall = {(s.labels["job"], s.labels["phase"]): s.value for s in families["trimtab_job_phase_wall_share_ratio"].samples}
    graded = {(s.labels["job"], s.labels["phase"]): s.value for s in families["trimtab_job_phase_share_ratio"].samples}
    assert wall[("async-loop", "update")] == pytest.approx(0.8) and graded[("async-loop", "update")] == pytest.approx(0.2)


def test_an_impossible_gpu_phase_time_is_refused(sqlite_api):
    api = sqlite_api
    api.post("/v1/jobs", {"name": "odd", "ranks": 1}, scope="job")
    body = wire(0)
    body["gpu_phases"]["evaluation"] = 1000.0  # 1000× a 1 s step
    r = api.post("/v1/jobs/odd/reports", body, scope="job")
    assert r.status_code == 422 and ["body", "gpu_phases", "evaluation"] in [e["loc"] for e in r.json()["detail"]]
