"""Planning off the report path (issue 20): a report is answered from ingest alone while a plan is stuck, a job is
queued for a plan once however many reports come in, the change a plan decides reaches the job (through the
hook's own reporter) on a following response, an exception in one plan does not stop planning, and stopping the
rebalancer ends its thread after the plan in progress.

A slow plan is made deterministic: the controller's ``plan`` is wrapped in a gate that holds it until the test
opens it, so "the report came back while the plan ran" is a fact, not a race against a sleep.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.loop_job import JOB, report
from trimtab.control import service as service_mod
from trimtab.control.plan_queue import PlanQueue
from trimtab.trainer.server_link import Reporter


class Gate:
    """Holds each plan of the jobs in ``names`` (every job when empty) until ``open()``; ``entered`` says one is
    held. A gate never opened gives up after 30 s, so a test that fails does not hang."""

    def __init__(self, monkeypatch, *names: str):
        self.entered, self._open = threading.Event(), threading.Event()
        real = service_mod.plan

        def gated(state, *args, **kwargs):
            if not names or state.job.name in names:
                self.entered.set()
                self._open.wait(30)
            return real(state, *args, **kwargs)

        monkeypatch.setattr(service_mod, "plan", gated)

    def open(self) -> None:
        self._open.set()


def timed_post(api, path: str, body: dict) -> tuple[dict, float]:
    start = time.monotonic()
    r = api.post(path, body, scope="job")
    assert r.status_code == 200, r.text
    return r.json(), time.monotonic() - start


def test_a_report_is_answered_while_the_jobs_plan_is_stuck(loop_api, rebalancer, monkeypatch):
    api = loop_api
    gate = Gate(monkeypatch)
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    first, first_s = timed_post(api, "/v1/jobs/ppo/reports", report(0))
    assert gate.entered.wait(10)  # the report queued a plan; the planning thread is now inside it, held
    # Reports keep coming while the plan is held: each is answered at once (planning on the report's path would
    # hold them until the gate gives up), and the job waits in the queue once, not once per report.
    later = [timed_post(api, "/v1/jobs/ppo/reports", report(n)) for n in (1, 2, 3)]
    assert first["stored"] and all(body["stored"] for body, _ in later)
    assert max([first_s] + [s for _, s in later]) < 5.0
    assert all(body["pending_changes"] == [] for body, _ in later)  # nothing decided yet
    assert rebalancer.queued() == ["ppo"]
    gate.open()
    assert rebalancer.wait_planned()
    body, _ = timed_post(api, "/v1/jobs/ppo/reports", report(4))
    assert [(c["knob"], c["value"]) for c in body["pending_changes"]] == [("batch_size", 4)]


def test_the_change_a_plan_decides_reaches_the_hook_on_a_following_response(loop_api, rebalancer):
    api = loop_api
    got: list[list] = []
    received = threading.Event()

    def on_pending(changes: list) -> None:
        got.append(changes)
        received.set()

    reporter = Reporter(api.url, "ppo", token=api.token("job"), registration=JOB, on_pending=on_pending)
    try:
        for n in range(10):  # 45 s generation-bound steps: the first report completes a window
            reporter.submit(report(n))
            if received.wait(0.5):
                break
            rebalancer.wait_planned()
        assert received.is_set() and not reporter.offline
    finally:
        reporter.close()
    change = got[0][0]
    assert (change["knob"], change["value"]) == ("batch_size", 4)
    [stored] = api.get("/v1/jobs/ppo/changes").json()["changes"]
    assert stored["change_id"] == change["change_id"] and stored["status"] == "pending"


def test_an_exception_in_one_plan_does_not_stop_planning(loop_api, rebalancer, monkeypatch):
    api = loop_api
    real, failed = service_mod.plan, []

    def fails_once_for_a(state, *args, **kwargs):
        if state.job.name == "a" and not failed:
            failed.append(state.job.name)
            raise RuntimeError("a plan blew up")
        return real(state, *args, **kwargs)

    monkeypatch.setattr(service_mod, "plan", fails_once_for_a)
    for name in ("a", "b"):
        assert api.post("/v1/jobs", {**JOB, "name": name}, scope="job").status_code == 201
        api.post(f"/v1/jobs/{name}/reports", report(0), scope="job")
    assert rebalancer.wait_planned()
    health = rebalancer.health()
    assert failed == ["a"] and health["errors"] == 1 and "a plan blew up" in health["last_error"]
    assert health["state"] == "running"
    # b was planned after a's failure; a's next report after its backoff plans it again, and this time it decides
    pending = lambda name, step: api.post(f"/v1/jobs/{name}/reports", report(step), scope="job").json()["pending_changes"]  # noqa: E731
    assert [c["value"] for c in pending("b", 1)] == [4]
    time.sleep(health["failing"]["a"]["retry_in_s"])
    pending("a", 1)
    assert rebalancer.wait_planned()
    assert [c["value"] for c in pending("a", 2)] == [4]


def test_stop_ends_the_thread_after_the_plan_in_progress_and_drops_the_queue(loop_api, rebalancer, monkeypatch):
    api = loop_api
    gate = Gate(monkeypatch, "a")
    for name in ("a", "b"):
        assert api.post("/v1/jobs", {**JOB, "name": name}, scope="job").status_code == 201
    api.post("/v1/jobs/a/reports", report(0), scope="job")
    assert gate.entered.wait(10)
    api.post("/v1/jobs/b/reports", report(0), scope="job")
    assert rebalancer.queued() == ["b"]
    stopping = threading.Thread(target=rebalancer.stop)
    stopping.start()
    stopping.join(0.3)
    assert stopping.is_alive()  # it waits for a's plan …
    gate.open()
    stopping.join(10)
    assert not stopping.is_alive() and rebalancer.health()["state"] == "stopped"
    jobs = rebalancer.health()["jobs"]
    assert "a" in jobs and "b" not in jobs  # … which ends; b's queued plan never runs
    # A stopped rebalancer neither queues nor plans on the report's thread.
    api.post("/v1/jobs/b/reports", report(1), scope="job")
    assert rebalancer.queued() == [] and "b" not in rebalancer.health()["jobs"]


def test_an_idle_planning_thread_stops_at_once(sqlite_api):
    rb = service_mod.Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules, interval_s=3600).start()
    start = time.monotonic()
    rb.stop()
    assert time.monotonic() - start < 2.0 and rb.health()["state"] == "stopped"


@pytest.mark.parametrize("forced", [False, True])
def test_a_job_queued_twice_waits_once_and_a_refusal_keeps_it_forced(forced):
    queue = PlanQueue()
    job = type("J", (), {"name": "j"})()
    queue.put(job)
    queue.put(job, forced=forced)
    queue.put(type("J", (), {"name": "k"})())
    assert queue.names() == ["j", "k"]
    assert queue.take(0) == (job, forced)


def test_the_planning_thread_leaves_the_interpreter_to_the_api_between_plans(sqlite_api):
    engine = sqlite_api.ctx.engine
    assert service_mod.Rebalancer(engine)._rest_s(0.04) == pytest.approx(0.04)  # the default: half the time
    assert service_mod.Rebalancer(engine, plan_share=0.25)._rest_s(0.04) == pytest.approx(0.12)
    assert service_mod.Rebalancer(engine, plan_share=1.0)._rest_s(0.04) == 0.0
    with pytest.raises(ValueError, match="plan_share must be in"):
        service_mod.Rebalancer(engine, plan_share=0.0)
