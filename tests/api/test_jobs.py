"""Jobs: idempotent registration, step reports, the knob-change loop (queue → delivered in the report's response
→ acknowledged per rank), modes, and the decisions listing the rebalancer will fill."""

from __future__ import annotations

import pytest

from trimtab.store.decisions import add_decision
from trimtab.store.jobs import get_job

JOB = {"name": "grpo-7b", "ranks": 4, "device_map": {"actor": [0, 1], "critic": [2], "reward": [3]},
       "hostnames": ["node-a"], "knobs": {"batch_size": {"value": 8, "min": 2, "max": 64},
                                          "prefetch": {"value": 1, "min": 0, "max": 8}}}
REPORT = {"step": 10, "rank": 0, "step_time_s": 2.5,
          "phases": {"generation": 1.2, "evaluation": 0.6, "communication": 0.2, "update": 0.4, "other": 0.1},
          "samples": 256, "tokens": 262144, "collective_latency_us": 42.0, "pid": 4242, "hostname": "node-a",
          "local_gpu": 0, "memory": {"allocated_bytes": 60 * 2**30, "reserved_bytes": 70 * 2**30,
                                     "fragmentation": 0.143, "num_alloc_retries": 0, "num_ooms": 0}}


@pytest.fixture
def job_api(api):
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    return api


def test_registering_again_updates_the_job_and_answers_200(job_api):
    api = job_api
    again = api.post("/v1/jobs", {**JOB, "ranks": 8, "mode": "auto"}, scope="job")
    assert again.status_code == 200
    job = api.get("/v1/jobs/grpo-7b").json()
    assert job["ranks"] == 8 and job["mode"] == "auto" and job["device_map"] == JOB["device_map"]
    assert job["knobs"]["batch_size"] == {"value": 8, "min": 2, "max": 64} and job["simulated"] is False
    assert job["last_report_ms"] is None and job["updated_ms"] >= job["created_ms"]
    assert api.get("/v1/jobs/unknown-job").status_code == 404


def test_jobs_are_listed_by_name_a_page_at_a_time(job_api):
    api = job_api
    for name in ("a-job", "z-job"):
        api.post("/v1/jobs", {"name": name, "ranks": 1}, scope="job")
    first = api.get("/v1/jobs", limit=2).json()
    assert [j["name"] for j in first["jobs"]] == ["a-job", "grpo-7b"] and first["next_offset"] == 2
    last = api.get("/v1/jobs", limit=2, offset=2).json()
    assert [j["name"] for j in last["jobs"]] == ["z-job"] and last["next_offset"] is None
    assert last["jobs"][0]["mode"] == "advise"  # the default


@pytest.mark.parametrize("change, loc", [
    ({"name": "has space"}, ["body", "name"]),
    ({"name": "x" * 129}, ["body", "name"]),
    ({"ranks": 0}, ["body", "ranks"]),
    ({"ranks": 4097}, ["body", "ranks"]),
    ({"mode": "sometimes"}, ["body", "mode"]),
    ({"knobs": {"batch_size": {"value": 100, "min": 2, "max": 64}}}, ["body", "knobs", "batch_size"]),
    ({"knobs": {"batch_size": {"value": 1, "min": 2}}}, ["body", "knobs", "batch_size", "max"]),
    ({"device_map": {"actor": [-1]}}, ["body", "device_map", "actor", 0]),
    ({"hostnames": ["a" * 256]}, ["body", "hostnames", 0]),
    ({"roles": [{"role": "actor", "node": "n", "gpus": [4096]}]}, ["body", "roles", 0, "gpus", 0]),
    ({"roles": [{"role": "has space", "node": "n"}]}, ["body", "roles", 0, "role"]),
    ({"roles": [{"role": "actor", "node": "n", "source": "guessed"}]}, ["body", "roles", 0, "source"]),
    ({"colour": "blue"}, ["body", "colour"]),
])
def test_an_invalid_registration_is_422_naming_the_field(sqlite_api, change, loc):
    r = sqlite_api.post("/v1/jobs", {**JOB, **change}, scope="job")
    assert r.status_code == 422
    assert loc in [e["loc"] for e in r.json()["detail"]], r.json()


def test_a_step_report_is_stored_once_and_listed_newest_first(job_api):
    api = job_api
    first = api.post("/v1/jobs/grpo-7b/reports", REPORT, scope="job").json()
    assert first == {"stored": True, "untimed": False, "pending_changes": []}
    assert api.post("/v1/jobs/grpo-7b/reports", REPORT, scope="job").json()["stored"] is False  # a resend
    for step, rank in ((11, 1), (11, 0), (12, 0)):
        api.post("/v1/jobs/grpo-7b/reports", {"step": step, "rank": rank, "step_time_s": 2.0}, scope="job")
    page = api.get("/v1/jobs/grpo-7b/reports", limit=3).json()
    assert [(r["step"], r["rank"]) for r in page["reports"]] == [(12, 0), (11, 0), (11, 1)]
    assert page["next_offset"] == 3 and page["simulated"] is False
    (oldest,) = api.get("/v1/jobs/grpo-7b/reports", limit=3, offset=3).json()["reports"]
    assert oldest["generation_s"] == 1.2 and oldest["fragmentation"] == 0.143 and oldest["tokens"] == 262144
    assert oldest["collective_latency_us"] == 42.0 and oldest["allocated_bytes"] == 60 * 2**30
    assert api.get("/v1/jobs/grpo-7b").json()["last_report_ms"] is not None
    assert api.get("/v1/jobs/nope/reports").status_code == 404


def test_what_a_framework_logged_for_a_step_is_kept_with_it(job_api):
    api = job_api
    logged = {"step_time": 0.13, "num_tokens": 170.0, "completions/mean_length": 7.0, "reward": 22.0}
    body = {**REPORT, "prompts": 2, "completions": 4, "completion_mean_tokens": 7.0, "reward_mean": -0.5,
            "logged": logged}
    assert api.post("/v1/jobs/grpo-7b/reports", body, scope="job").json()["stored"] is True
    (r,) = api.get("/v1/jobs/grpo-7b/reports").json()["reports"]
    assert (r["prompts"], r["completions"], r["completion_mean_tokens"], r["reward_mean"]) == (2, 4, 7.0, -0.5)
    assert r["logged"] == logged
    too_many = {**REPORT, "step": 11, "logged": {f"k{i}": 1.0 for i in range(65)}}
    assert api.post("/v1/jobs/grpo-7b/reports", too_many, scope="job").status_code == 422
    reason = {**JOB, "knobs": {}, "advise_only_reason": "the dataloader is built once"}
    assert api.post("/v1/jobs", reason, scope="job").json()["advise_only_reason"] == "the dataloader is built once"


def test_a_report_from_a_rank_the_job_does_not_have_is_422(job_api):
    r = job_api.post("/v1/jobs/grpo-7b/reports", {**REPORT, "rank": 4}, scope="job")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rank"]
    bad = job_api.post("/v1/jobs/grpo-7b/reports", {**REPORT, "memory": {"fragmentation": 1.5}}, scope="job")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "memory", "fragmentation"]
    assert job_api.post("/v1/jobs/nope/reports", REPORT, scope="job").status_code == 404


BATCHES = "/v1/jobs/grpo-7b/report-batches"


def batch_of(*steps: int, rank: int = 0, **fields) -> dict:
    return {"reports": [{**REPORT, "step": step, "rank": rank, **fields} for step in steps]}


def stored_steps(api) -> list[tuple[int, int]]:
    return [(r["step"], r["rank"]) for r in api.get("/v1/jobs/grpo-7b/reports", limit=1000).json()["reports"]]


def test_a_batch_of_reports_is_stored_and_listed_and_a_resend_is_not_stored_twice(job_api):
    api = job_api
    calls = []
    api.ctx.after_report = lambda job, step, step_time_s, earlier=(), **_: calls.append((step, step_time_s, earlier))
    first = api.post(BATCHES, batch_of(10, 11, 12), scope="job")
    assert first.status_code == 200 and first.json() == {"stored": 3, "received": 3, "untimed": 0,
                                                         "pending_changes": []}
    assert stored_steps(api) == [(12, 0), (11, 0), (10, 0)]
    (newest, *_) = api.get("/v1/jobs/grpo-7b/reports").json()["reports"]
    assert newest["generation_s"] == 1.2 and newest["fragmentation"] == 0.143 and newest["tokens"] == 262144
    assert calls == [(12, 2.5, [(10, 2.5), (11, 2.5)])]  # after_report once per batch, with its newest report
    # A resend after a lost answer, grown by a new report, another rank's, and one sent twice: only new ones count.
    again = {"reports": [*batch_of(11, 12, 13)["reports"], {**REPORT, "step": 13}, {**REPORT, "step": 12, "rank": 1}]}
    assert api.post(BATCHES, again, scope="job").json() == {"stored": 2, "received": 5, "untimed": 0,
                                                            "pending_changes": []}
    assert stored_steps(api) == [(13, 0), (12, 0), (12, 1), (11, 0), (10, 0)]
    assert calls[1] == (13, 2.5, [(12, 2.5)])  # the batch's new reports only
    assert api.post(BATCHES, batch_of(10, 11), scope="job").json()["stored"] == 0 and len(calls) == 2
    assert api.post("/v1/jobs/grpo-7b/reports", {**REPORT, "step": 13}, scope="job").json()["stored"] is False
    assert api.post("/v1/jobs/nope/report-batches", batch_of(1), scope="job").status_code == 404


@pytest.mark.parametrize("bad, loc", [
    ({"step_time_s": 10_000.0}, ["body", "reports", 1, "step_time_s"]),  # longer than the job has existed
    ({"samples": -1}, ["body", "reports", 1, "samples"]),
    ({"rank": 4}, ["body", "reports", 1, "rank"]),  # the job has 4 ranks
    ({"phases": {"generation": 100.0}}, ["body", "reports", 1, "phases", "generation"]),
    ({"step": 11 + 10_001}, ["body", "reports", 1, "step"]),  # more steps ahead of report 0 than a job can be
])
def test_one_invalid_report_refuses_the_whole_batch_naming_its_index_and_field(job_api, bad, loc):
    api = job_api
    # A second bad report (one the schema allows): the first one is named. (One that breaks the schema is named
    # before any that fails a check against the job: the body is parsed before the route runs.)
    body = {"reports": [{**REPORT, "step": 10}, {**REPORT, "step": 11, **bad}, {**REPORT, "step": 12},
                        {**REPORT, "step": 13, "step_time_s": 20_000.0}]}
    r = api.post(BATCHES, body, scope="job")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text
    assert stored_steps(api) == []  # all or nothing: not even report 0
    assert api.get("/v1/jobs/grpo-7b").json()["last_report_ms"] is None


def test_a_batch_s_steps_are_checked_against_its_earlier_reports_too(job_api):
    api = job_api
    far = api.post(BATCHES, batch_of(0, 10_001), scope="job")  # no reports stored yet: report 0 is the newest
    assert far.status_code == 422 and far.json()["detail"][0]["loc"] == ["body", "reports", 1, "step"]
    assert api.post(BATCHES, batch_of(0), scope="job").json()["stored"] == 1
    # Step 20 000 is 20 000 ahead of the stored newest, but 10 000 ahead of the batch's report before it.
    assert api.post(BATCHES, batch_of(10_000, 20_000), scope="job").json()["stored"] == 2


def test_a_batch_holds_1_to_256_reports(sqlite_api):
    api = sqlite_api
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    for size in (0, 257):
        r = api.post(BATCHES, batch_of(*range(size)), scope="job")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "reports"], r.text
    assert stored_steps(api) == []
    assert api.post(BATCHES, batch_of(*range(256)), scope="job").json() == {"stored": 256, "received": 256,
                                                                            "untimed": 0, "pending_changes": []}


def test_a_batch_needs_a_token_that_may_write_to_the_job_as_one_report_does(sqlite_api):
    api = sqlite_api
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    other = api.post("/v1/tokens", {"name": "other job", "scope": "job"}, token=api.admin_token).json()["token"]
    r = api.post(BATCHES, batch_of(1), token=other)
    assert r.status_code == 403 and "another job token" in r.json()["detail"], r.text
    assert api.post(BATCHES, batch_of(1), token=api.token("agent")).status_code == 403
    assert api.post(BATCHES, batch_of(1)).status_code == 401
    assert stored_steps(api) == []
    assert api.post(BATCHES, batch_of(1), token=api.admin_token).json()["stored"] == 1


def test_a_batch_s_answer_carries_the_pending_changes(job_api):
    api = job_api
    change = api.post("/v1/jobs/grpo-7b/changes", {"knob": "prefetch", "value": 2, "reason": "gen-bound"},
                      token=api.admin_token).json()
    pending = api.post(BATCHES, batch_of(10, 11), scope="job").json()["pending_changes"]
    assert pending == [{"change_id": change["change_id"], "knob": "prefetch", "value": 2, "reason": "gen-bound"}]
    api.post("/v1/jobs/grpo-7b/mode", {"mode": "off"}, token=api.admin_token, method="PUT")
    assert api.post(BATCHES, batch_of(12), scope="job").json()["pending_changes"] == []


def test_a_manual_change_reaches_the_job_and_is_acknowledged_per_rank(job_api):
    api = job_api
    queued = api.post("/v1/jobs/grpo-7b/changes", {"knob": "batch_size", "value": 16, "reason": "gen-bound"},
                      token=api.admin_token)
    assert queued.status_code == 201
    change = queued.json()
    assert change["status"] == "pending" and change["previous_value"] == 8 and change["source"] == "manual"
    pending = api.post("/v1/jobs/grpo-7b/reports", REPORT, scope="job").json()["pending_changes"]
    assert pending == [{"change_id": change["change_id"], "knob": "batch_size", "value": 16, "reason": "gen-bound"}]
    for rank in (0, 1):
        r = api.post("/v1/jobs/grpo-7b/acks", {"change_id": change["change_id"], "applied_at_step": 11,
                                               "rank": rank}, scope="job")
        assert r.status_code == 200
    acked = r.json()
    assert acked["status"] == "applied" and acked["applied_step"] == 11
    assert [a["rank"] for a in acked["acks"]] == [0, 1]
    assert api.get("/v1/jobs/grpo-7b").json()["knobs"]["batch_size"]["value"] == 16
    assert api.post("/v1/jobs/grpo-7b/reports", {**REPORT, "step": 11}, scope="job").json()["pending_changes"] == []
    listed = api.get("/v1/jobs/grpo-7b/changes").json()["changes"]
    assert [c["status"] for c in listed] == ["applied"]


def test_acks_of_unknown_changes_or_ranks_are_refused(job_api):
    api = job_api
    unknown = api.post("/v1/jobs/grpo-7b/acks", {"change_id": 999, "applied_at_step": 1, "rank": 0}, scope="job")
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "change_id"]
    change = api.post("/v1/jobs/grpo-7b/changes", {"knob": "prefetch", "value": 2}, token=api.admin_token).json()
    r = api.post("/v1/jobs/grpo-7b/acks", {"change_id": change["change_id"], "applied_at_step": 1, "rank": 9},
                 scope="job")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rank"]


def test_a_change_must_name_a_declared_knob_within_its_bounds(job_api):
    api = job_api
    over = api.post("/v1/jobs/grpo-7b/changes", {"knob": "batch_size", "value": 65}, token=api.admin_token)
    assert over.status_code == 422 and over.json()["detail"][0]["loc"] == ["body", "value"]
    fractional = api.post("/v1/jobs/grpo-7b/changes", {"knob": "batch_size", "value": 12.5}, token=api.admin_token)
    assert fractional.status_code == 422 and fractional.json()["detail"][0]["loc"] == ["body", "value"]
    unknown = api.post("/v1/jobs/grpo-7b/changes", {"knob": "lr", "value": 1}, token=api.admin_token)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "knob"]
    assert api.post("/v1/jobs/nope/changes", {"knob": "lr", "value": 1}, token=api.admin_token).status_code == 404


def test_a_new_change_supersedes_the_pending_one(job_api):
    api = job_api
    first = api.post("/v1/jobs/grpo-7b/changes", {"knob": "prefetch", "value": 2}, token=api.admin_token).json()
    second = api.post("/v1/jobs/grpo-7b/changes", {"knob": "prefetch", "value": 3}, token=api.admin_token).json()
    statuses = {c["change_id"]: c["status"] for c in api.get("/v1/jobs/grpo-7b/changes").json()["changes"]}
    assert statuses == {first["change_id"]: "superseded", second["change_id"]: "pending"}
    pending = api.post("/v1/jobs/grpo-7b/reports", REPORT, scope="job").json()["pending_changes"]
    assert [c["value"] for c in pending] == [3]


def test_mode_off_cancels_and_refuses_changes(job_api):
    api = job_api
    api.post("/v1/jobs/grpo-7b/changes", {"knob": "prefetch", "value": 2}, token=api.admin_token)
    r = api.post("/v1/jobs/grpo-7b/mode", {"mode": "off"}, token=api.admin_token, method="PUT")
    assert r.status_code == 200 and r.json()["mode"] == "off"
    assert [c["status"] for c in api.get("/v1/jobs/grpo-7b/changes").json()["changes"]] == ["cancelled"]
    assert api.post("/v1/jobs/grpo-7b/reports", REPORT, scope="job").json()["pending_changes"] == []
    refused = api.post("/v1/jobs/grpo-7b/changes", {"knob": "prefetch", "value": 2}, token=api.admin_token)
    assert refused.status_code == 409
    assert api.post("/v1/jobs/grpo-7b/mode", {"mode": "later"}, token=api.admin_token, method="PUT").status_code == 422
    assert api.post("/v1/jobs/nope/mode", {"mode": "auto"}, token=api.admin_token, method="PUT").status_code == 404


def test_re_registering_with_narrower_bounds_cancels_a_change_they_no_longer_allow(job_api):
    api = job_api
    api.post("/v1/jobs/grpo-7b/changes", {"knob": "batch_size", "value": 48}, token=api.admin_token)
    narrower = {**JOB, "knobs": {**JOB["knobs"], "batch_size": {"value": 8, "min": 2, "max": 32}}}
    api.post("/v1/jobs", narrower, scope="job")
    assert [c["status"] for c in api.get("/v1/jobs/grpo-7b/changes").json()["changes"]] == ["cancelled"]


def test_decisions_are_listed_newest_first_with_their_evidence(job_api):
    api = job_api
    assert api.get("/v1/decisions").json() == {"simulated": False, "decisions": [], "next_offset": None}
    job_id = get_job(api.ctx.engine, "grpo-7b").id
    for i in range(3):
        add_decision(api.ctx.engine, job_id, "step_composition", {"generation_share": 0.6 + i / 100}, ts_ms=1000 + i,
                     knob="batch_size", old_value=8.0, new_value=16.0, outcome="advised",
                     throughput_before_samples_per_s=100.0)
    api.post("/v1/jobs", {"name": "other", "ranks": 1}, scope="job")
    add_decision(api.ctx.engine, get_job(api.ctx.engine, "other").id, "pcie", {"pcie_pct": 95}, ts_ms=999)
    page = api.get("/v1/decisions", job="grpo-7b", limit=2).json()
    assert [d["evidence"]["generation_share"] for d in page["decisions"]] == [0.62, 0.61]
    assert page["next_offset"] == 2 and page["decisions"][0]["new_value"] == 16
    assert page["decisions"][0]["job"] == "grpo-7b" and page["decisions"][0]["outcome"] == "advised"
    assert len(api.get("/v1/decisions").json()["decisions"]) == 4
    assert api.get("/v1/decisions", job="nope").status_code == 404


ROLES = [{"role": "actor", "node": "node-a", "gpus": [0], "pids": [101]},
         {"role": "actor", "node": "node-a", "gpus": [1], "pids": [102]},  # a second worker of the same group
         {"role": "rollout", "node": "node-a", "gpus": [0, 1], "pids": [101, 102]},
         {"role": "critic", "node": "node-b", "gpus": [0], "pids": [7]}]


def test_roles_found_by_the_job_are_shown_as_gpus_by_role_and_give_the_device_map_unless_one_is_typed(api):
    r = api.post("/v1/jobs", {"name": "found", "ranks": 1, "hostnames": ["node-a"], "roles": ROLES}, scope="job")
    assert r.status_code == 201, r.text
    job = api.get("/v1/jobs/found").json()
    assert job["gpus_by_role"] == {"actor": {"node-a": [0, 1]}, "rollout": {"node-a": [0, 1]},
                                   "critic": {"node-b": [0]}}
    assert job["roles"][0] == {"role": "actor", "node": "node-a", "gpus": [0, 1], "pids": [101, 102],
                               "source": "found"}  # one entry per role and node
    assert job["device_map"] == {"actor": [0, 1], "critic": [0], "rollout": [0, 1]}  # derived for attribution
    typed = {"name": "typed", "ranks": 1, "hostnames": ["node-a"], "roles": ROLES, "device_map": {"actor": [3]}}
    assert api.post("/v1/jobs", typed, scope="job").status_code == 201
    job = api.get("/v1/jobs/typed").json()
    assert job["device_map"] == {"actor": [3]}  # --device-map overrides what was found
    assert job["gpus_by_role"]["critic"] == {"node-b": [0]}  # the roles found are still shown
    # a job that typed only a device map, on one node: its GPUs by role come from it
    assert api.get("/v1/jobs/grpo-7b").status_code == 404
    api.post("/v1/jobs", JOB, scope="job")
    assert api.get("/v1/jobs/grpo-7b").json()["gpus_by_role"] == {
        "actor": {"node-a": [0, 1]}, "critic": {"node-a": [2]}, "reward": {"node-a": [3]}}


def test_gpus_a_job_could_not_tell_are_found_by_matching_its_worker_pids_to_nvmls_process_list(api):
    """A worker whose CUDA_VISIBLE_DEVICES holds GPU UUIDs registers its pid without GPU indices; the agent's NVML
    process list on that node (written here through the store's own batch writer) names the GPUs."""
    import time

    from trimtab.contract.readings import Batch, GpuInfo, GpuProcess, NodeInfo
    from trimtab.store.ingest import BatchWriter

    now = int(time.time() * 1000)
    writer = BatchWriter(api.ctx.engine)
    try:
        writer.write(Batch(node=NodeInfo("node-c"), gpus=[GpuInfo(f"GPU-c{i}", i, "H200") for i in range(4)],
                           processes=[GpuProcess("GPU-c2", now, 5001), GpuProcess("GPU-c3", now, 5002),
                                      GpuProcess("GPU-c0", now, 9999)]))  # 9999: someone else's process
    finally:
        writer.close()
    roles = [{"role": "actor", "node": "node-c", "pids": [5001, 5002]},
             {"role": "critic", "node": "node-c", "pids": [4242]}]  # not on any GPU NVML listed
    assert api.post("/v1/jobs", {"name": "uuids", "ranks": 1, "hostnames": ["node-c"], "roles": roles},
                    scope="job").status_code == 201
    job = api.get("/v1/jobs/uuids").json()
    assert job["roles"][0] == {"role": "actor", "node": "node-c", "gpus": [2, 3], "pids": [5001, 5002],
                               "source": "nvml"}
    assert job["roles"][1]["gpus"] == [] and job["roles"][1]["source"] == "found"
    assert job["gpus_by_role"] == {"actor": {"node-c": [2, 3]}} and job["device_map"] == {"actor": [2, 3]}
