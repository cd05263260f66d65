"""The rebalancer wired into the API and the daemon: a report queues a plan, the plan runs on the rebalancer's
thread and the change it decides rides on the response to the job's next report; per-job rules are checked at registration, a bad rules file stops the daemon with its line, and /healthz shows the
rebalancer."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.loop_job import JOB, report
from tests.support.procs import admin_secret, stop, trimtab, wait_http
from trimtab.grading.rules import default_rules


def until(predicate, timeout_s: float = 20.0):
    """Polls ``predicate`` (the daemon in a subprocess plans on its own thread) until it returns something true."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def test_a_change_decided_on_a_report_comes_back_in_the_next_reports_response(loop_api, rebalancer):
    api = loop_api
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    assert api.post("/v1/jobs/ppo/reports", report(0), scope="job").json()["stored"] is True
    assert rebalancer.wait_planned()
    body = api.post("/v1/jobs/ppo/reports", report(1), scope="job").json()
    assert [(c["knob"], c["value"]) for c in body["pending_changes"]] == [("batch_size", 4)]
    assert body["pending_changes"][0]["reason"].startswith("generation_bound:")
    decision = api.get("/v1/decisions", job="ppo").json()["decisions"][0]
    assert (decision["rule"], decision["outcome"], decision["old_value"], decision["new_value"]) == \
        ("generation_bound", "pending", 1, 4)
    assert decision["evidence"]["reading"]["value"] == pytest.approx(100 * 44.0 / 45.0, abs=0.01)
    # A resent report stores nothing and decides nothing new: still exactly one change.
    again = api.post("/v1/jobs/ppo/reports", report(1), scope="job").json()
    assert again["stored"] is False and rebalancer.wait_planned()
    assert len(api.get("/v1/jobs/ppo/changes").json()["changes"]) == 1


def test_advise_mode_answers_reports_without_changes_but_records_the_advice(loop_api, rebalancer):
    api = loop_api
    assert api.post("/v1/jobs", {**JOB, "mode": "advise"}, scope="job").status_code == 201
    api.post("/v1/jobs/ppo/reports", report(0), scope="job")
    assert rebalancer.wait_planned()
    body = api.post("/v1/jobs/ppo/reports", report(1), scope="job").json()
    assert body["pending_changes"] == []
    [decision] = api.get("/v1/decisions", job="ppo").json()["decisions"]
    assert decision["outcome"] == "advised" and decision["new_value"] == 4 and decision["change_id"] is None


def test_per_job_rules_are_checked_at_registration_and_used(loop_api, rebalancer):
    api = loop_api
    bad = api.post("/v1/jobs", {**JOB, "rules": {"rules": {"generation_bound": {"act_abov": 60}}}}, scope="job")
    assert bad.status_code == 422 and "has no key 'act_abov'" in bad.text
    bad = api.post("/v1/jobs", {**JOB, "rules": {"rules": {"generation_bound": {"act_above": "high"}}}}, scope="job")
    assert bad.status_code == 422 and "expected a number" in bad.text
    ok = api.post("/v1/jobs", {**JOB, "rules": {"rules": {"generation_bound": {"act_above": 99.0}}}}, scope="job")
    assert ok.status_code == 201 and ok.json()["rules"] == {"rules": {"generation_bound": {"act_above": 99.0}}}
    api.post("/v1/jobs/ppo/reports", report(0), scope="job")
    assert rebalancer.wait_planned()
    body = api.post("/v1/jobs/ppo/reports", report(1), scope="job").json()
    assert body["pending_changes"] == []  # 97.8 % generation is below this job's own act line
    assert rebalancer.health()["evaluations"] >= 1  # (it was planned, and decided nothing)


def test_a_bad_rules_file_stops_the_daemon_with_its_line(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[controller]\nwindow_min_s = 2.0\n\n[rules.pcie]\nact_above = 95.0\nhealthy_below = 99.0\n")
    proc = trimtab("up", "--simulate", "1", "--port", "0", "--rules-file", str(rules),
                   env={"TRIMTAB_STATE_DIR": str(tmp_path / "state")})
    try:
        _, err = proc.communicate(timeout=60)  # it must exit by itself, before serving anything
    finally:
        stop(proc)
    assert proc.returncode == 78, err  # EX_CONFIG: systemd does not restart it in a loop
    assert f"rules rejected: {rules} (line 6): rules.pcie.healthy_below: healthy_below (99.0) is above act_above" in err


@pytest.mark.parametrize("command", ["up", "server"])
@pytest.mark.parametrize("content", [None, "[rules.pcie\nact_above = 95.0\n", b"\xff\xfe[rules]"])
def test_a_rules_file_that_cannot_be_read_or_parsed_is_refused_before_anything_starts(tmp_path, command, content):
    """Missing, a TOML syntax error, not UTF-8: exit 78 at once, naming the file; no store, token or sample."""
    rules = tmp_path / "rules.toml"
    if isinstance(content, bytes):
        rules.write_bytes(content)
    elif content is not None:
        rules.write_text(content)
    state = tmp_path / "state"
    args = ["--simulate", "1", "--interval", "0.1"] if command == "up" else []
    proc = trimtab(command, *args, "--port", "0", "--rules-file", str(rules), env={"TRIMTAB_STATE_DIR": str(state)})
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 78, err
    assert f"rules rejected: {rules}" in err and "Traceback" not in err, err
    assert not (state / "trimtab.db").exists() and not (state / "admin.token").exists()  # nothing was started


def test_up_runs_the_rebalancer_and_says_so_on_healthz(tmp_path):
    from tests.support.procs import free_port

    port = free_port()
    proc = trimtab("up", "--simulate", "1", "--port", str(port), "--status-every", "1",
                   env={"TRIMTAB_STATE_DIR": str(tmp_path / "state")})
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        rebalancer = health["components"]["rebalancer"]
        assert rebalancer["state"] == "running" and rebalancer["rules"] == len(default_rules().rules) and rebalancer["errors"] == 0
    finally:
        stop(proc)


def test_rule_overrides_in_trimtab_toml_are_checked_at_start(tmp_path):
    config = tmp_path / "trimtab.toml"
    config.write_text("[rules.pcie]\nact_abov = 95.0\n")
    proc = trimtab("--config", str(config), "up", "--simulate", "1", "--port", "0",
                   env={"TRIMTAB_STATE_DIR": str(tmp_path / "state")})
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 78, err
    assert f"rules rejected: {config}: rule 'pcie' has no key 'act_abov'" in err


def test_a_daemon_killed_mid_change_resumes_it_from_the_store_and_applies_it_once(tmp_path):
    import signal

    from tests.support.procs import free_port

    port, state = free_port(), tmp_path / "state"
    url = f"http://127.0.0.1:{port}"

    def start():
        proc = trimtab("up", "--simulate", "1", "--port", str(port), env={"TRIMTAB_STATE_DIR": str(state)})
        wait_http(f"{url}/healthz", proc=proc)
        return proc

    proc = start()
    try:
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        assert httpx.post(f"{url}/v1/jobs", json=JOB, headers=admin).status_code == 201
        httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(0), headers=admin)
        until(lambda: httpx.get(f"{url}/v1/jobs/ppo/changes").json()["changes"])  # planned on its own thread
        first = httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(1), headers=admin).json()
        [change] = first["pending_changes"]
        assert (change["knob"], change["value"]) == ("batch_size", 4)
        stop(proc, signal.SIGKILL)  # the daemon dies with the change in flight, before the job applied it

        proc = start()
        again = httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(2), headers=admin).json()
        assert again["pending_changes"] == first["pending_changes"]  # the same change, not a second one
        ack = {"change_id": change["change_id"], "applied_at_step": 3, "rank": 0}
        assert httpx.post(f"{url}/v1/jobs/ppo/acks", json=ack, headers=admin).status_code == 200
        stop(proc, signal.SIGKILL)  # and dies again while measuring the change

        proc = start()
        for step in (3, 4):  # the settle step, then a 12 s step at batch 4: 4× the throughput
            httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(step, step_time=12.0, gen=11.0), headers=admin)

        def next_change():
            return [c for c in httpx.get(f"{url}/v1/jobs/ppo/changes").json()["changes"] if c["value"] == 16]
        until(next_change)  # the verdict and, in the same plan, the next change
        [kept, *_] = httpx.get(f"{url}/v1/decisions", params={"job": "ppo"}).json()["decisions"][::-1]
        assert (kept["outcome"], kept["applied_step"], kept["change_id"]) == ("kept", 3, change["change_id"])
        assert kept["throughput_after_samples_per_s"] == pytest.approx(64 / 12)
        changes = httpx.get(f"{url}/v1/jobs/ppo/changes").json()["changes"]
        assert [c["change_id"] for c in changes if c["value"] == 4] == [change["change_id"]]  # applied once
        body = httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(5, step_time=12.0, gen=11.0), headers=admin).json()
        assert [c["value"] for c in body["pending_changes"]] == [16]  # the next report carries the next change
    finally:
        stop(proc)


@pytest.mark.postgres
def test_the_head_node_rebalances_jobs_on_postgresql(pg_url, tmp_path):
    from tests.support.procs import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.err"
    with log.open("w") as err:
        server = trimtab("server", "--db", pg_url, "--port", str(port), "--status-every", "1",
                         env={"TRIMTAB_STATE_DIR": str(tmp_path / "state")}, stderr=err)
    try:
        wait_http(f"{url}/healthz", proc=server)
        admin = {"Authorization": f"Bearer {admin_secret(tmp_path / 'state')}"}
        assert httpx.post(f"{url}/v1/jobs", json={**JOB, "ranks": 2}, headers=admin).status_code == 201
        r0 = httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(0), headers=admin).json()
        assert r0["pending_changes"] == []  # rank 1 has not reported step 0 yet
        httpx.post(f"{url}/v1/jobs/ppo/reports", json={**report(0), "rank": 1}, headers=admin)
        until(lambda: httpx.get(f"{url}/healthz").json()["components"]["rebalancer"]["changes_queued"] == 1)
        r1 = httpx.post(f"{url}/v1/jobs/ppo/reports", json=report(1), headers=admin).json()
        assert [(c["knob"], c["value"]) for c in r1["pending_changes"]] == [("batch_size", 4)]
        # the status line (systemd STATUS, every 1 s) says what it did
        until(lambda: "rebalancer: 1 jobs, 1 changes" in log.read_text())
    finally:
        stop(server)
