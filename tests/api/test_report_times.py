"""A step report keeps the time its step ended (issue 39, items 3 and 4): the hook stamps ``ended_ms`` at the step's
boundary, the server files it, and the controller's windows read it — so ten minutes of reports spooled through a
head outage land at their steps' times, not at the one instant they arrived. More than MAX_CLOCK_AHEAD_S ahead of
the server's clock it is not trusted: the report is filed at its arrival and the answer says so."""

from __future__ import annotations

from trimtab.contract.readings import MAX_CLOCK_AHEAD_S
from trimtab.grading.window import load_steps
from trimtab.store.jobs import get_job
from tests.api.conftest import now_ms
from tests.api.test_jobs import BATCHES, JOB, REPORT, job_api  # noqa: F401 - the fixture

MINUTE_MS = 60_000


def steps_of(api) -> dict[int, tuple[int, int]]:
    """step → (start_ms, end_ms) as the controller reads them (job_api's job has 4 ranks)."""
    job = get_job(api.ctx.engine, JOB["name"])
    return {s.step: (s.start_ms, s.end_ms) for s in load_steps(api.ctx.engine, job.id, JOB["ranks"])}


def test_reports_sent_late_keep_their_steps_times(job_api):
    api = job_api
    ten_min_ago = now_ms() - 10 * MINUTE_MS
    for rank in range(4):  # an outage's backlog: steps 10 and 11 ended ten and nine minutes ago
        body = {"reports": [{**REPORT, "rank": rank, "step": 10, "ended_ms": ten_min_ago + rank},
                            {**REPORT, "rank": rank, "step": 11, "ended_ms": ten_min_ago + MINUTE_MS}]}
        r = api.post(BATCHES, body, scope="job")
        assert r.status_code == 200 and r.json()["untimed"] == 0, r.text
    assert steps_of(api) == {10: (ten_min_ago + 3 - 2500, ten_min_ago + 3),  # its slowest rank's end
                             11: (ten_min_ago + MINUTE_MS - 2500, ten_min_ago + MINUTE_MS)}
    listed = api.get(f"/v1/jobs/{JOB['name']}/reports").json()["reports"]
    assert {r["ended_ms"] for r in listed if r["step"] == 11} == {ten_min_ago + MINUTE_MS}
    assert all(r["received_ms"] >= ten_min_ago + 10 * MINUTE_MS - 1000 for r in listed), "arrival kept apart"


def test_a_report_stamped_too_far_ahead_is_filed_at_its_arrival_and_said_so(job_api):
    api = job_api
    ahead = now_ms() + (MAX_CLOCK_AHEAD_S + 60) * 1000
    before = now_ms()
    one = api.post(f"/v1/jobs/{JOB['name']}/reports", {**REPORT, "ended_ms": ahead}, scope="job").json()
    assert one["stored"] is True and one["untimed"] is True
    batch = {"reports": [{**REPORT, "rank": rank, "ended_ms": ahead} for rank in (1, 2)]
             + [{**REPORT, "rank": 3, "ended_ms": before}]}
    assert api.post(BATCHES, batch, scope="job").json()["untimed"] == 2
    (start_ms, end_ms), = steps_of(api).values()
    assert before <= end_ms <= now_ms(), "the ranks in time's stamp, and the arrival of the others"
    listed = api.get(f"/v1/jobs/{JOB['name']}/reports").json()["reports"]
    assert sorted(r["ended_ms"] is None for r in listed) == [False, True, True, True]


def test_a_report_without_ended_ms_is_timed_at_its_arrival_as_before(job_api):
    api = job_api
    before = now_ms()
    for rank in range(4):
        assert api.post(f"/v1/jobs/{JOB['name']}/reports", {**REPORT, "rank": rank}, scope="job").json()["stored"]
    (start_ms, end_ms), = steps_of(api).values()
    assert before <= end_ms <= now_ms() and end_ms - start_ms == 2500
