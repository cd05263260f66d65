"""The reporter's batches and pacing (src/trimtab/trainer/server_link.py): several queued reports in one POST, a
batch refused whole sent again one report at a time, one POST per report to a server without the batch route, POSTs
of reports paced (a full batch at once), and the real API storing a batch."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest

from tests.support.fake_server import FakeServer, messages
from tests.support.hook_api import reports_of
from tests.support.waits import eventually
from trimtab.trainer.server_link import Reporter


def held_reporter(server: FakeServer, batch_max: int = 64, **kw) -> Reporter:
    """A reporter of job "fake" whose thread is held inside its first request (the registration) until the test
    opens ``server.gate``: what the test submits meanwhile is queued, all of it."""
    server.gate = threading.Event()
    reporter = Reporter("http://trimtab.invalid", "fake", "tok", registration={"name": "fake", "ranks": 1},
                        transport=httpx.MockTransport(server), backoff_max_s=0.2, batch_max=batch_max, **kw)
    eventually(lambda: server.requests)  # the registration is in flight, waiting at the gate
    return reporter


def submit_held(server: FakeServer, reporter: Reporter, steps) -> None:
    """Queues reports of ``steps`` while the reporter thread waits at the gate, then lets it go."""
    for step in steps:
        reporter.submit({"step": step, "rank": 0, "step_time_s": 0.01})
    server.gate.set()


def lone_then_group(server: FakeServer, reporter: Reporter, lone: int, group) -> None:
    """Holds the reporter inside its next request, queues report ``lone`` alone and waits until it is in flight,
    then queues ``group`` while it is held and lets it go: a lone report, then a group queued behind a POST."""
    server.gate = threading.Event()
    reporter.submit({"step": lone, "rank": 0, "step_time_s": 0.01})
    eventually(lambda: single_steps(server)[-1:] == [lone])  # held inside its POST
    submit_held(server, reporter, group)


def queued_then_lone_then_group(server: FakeServer, reporter: Reporter, queued: int, group: int) -> None:
    """Steps 0 … ``queued`` − 1 queued behind the held registration, all delivered; then step ``queued`` alone and
    ``group`` more behind its POST (``lone_then_group``), all delivered."""
    submit_held(server, reporter, range(queued))
    eventually(lambda: server.delivered == set(range(queued)))
    lone_then_group(server, reporter, queued, range(queued + 1, queued + 1 + group))
    eventually(lambda: server.delivered == set(range(queued + 1 + group)))


def batch_steps(server: FakeServer) -> list[list[int]]:
    return [[r["step"] for r in b["reports"]] for b in server.posted("/report-batches")]


def single_steps(server: FakeServer) -> list[int]:
    return [b["step"] for b in server.posted("/reports")]


def test_queued_reports_go_in_one_post_of_up_to_batch_max_and_a_lone_one_goes_alone():
    server = FakeServer()
    server.pending = [{"change_id": 3, "knob": "prefetch", "value": 2, "reason": "r"}]
    got: list[list] = []
    reporter = held_reporter(server, batch_max=3, on_pending=got.append)
    try:
        queued_then_lone_then_group(server, reporter, 7, 2)
    finally:
        reporter.close()
    assert batch_steps(server) == [[0, 1, 2], [3, 4, 5], [8, 9]]
    assert single_steps(server) == [6, 7]  # the one left over, and the one queued alone
    assert reporter.sent == 10 and reporter.rejected == reporter.dropped == 0 and len(got) == 5


def _posts_for_steps_of(step_s: float, min_interval_s: float, n: int = 40,
                        **kw) -> tuple[int, FakeServer, Reporter]:
    """How many report POSTs ``n`` reports ``step_s`` apart took (the server answers at once), the server and the
    reporter (``kw``: its other options)."""
    server = FakeServer()
    reporter = Reporter("http://trimtab.invalid", "fake", "tok", registration={"name": "fake", "ranks": 1},
                        transport=httpx.MockTransport(server), min_interval_s=min_interval_s, **kw)
    try:
        for step in range(n):
            reporter.submit({"step": step, "rank": 0, "step_time_s": step_s})
            time.sleep(step_s)
        eventually(lambda: server.delivered == set(range(n)))
    finally:
        reporter.close()
    return len(server.posted("/reports")) + len(server.posted("/report-batches")), server, reporter


def test_posts_are_paced_so_the_reports_of_steps_shorter_than_the_interval_go_together():
    # 40 steps of 5 ms: unpaced, a POST per report or nearly (the fake server answers at once); paced at 50 ms, a
    # POST at most every 50 ms for 0.2 s of steps (5 or so), every report still delivered.
    unpaced, _, _ = _posts_for_steps_of(0.005, 0.0)
    paced, server, _ = _posts_for_steps_of(0.005, 0.05)
    assert unpaced >= 20 and paced <= 10 and server.delivered == set(range(40)), (unpaced, paced)
    # Steps longer than the interval: one POST per report, as before.
    slow, _, _ = _posts_for_steps_of(0.08, 0.05, n=6)
    assert slow == 6


def test_a_full_batch_ends_the_pacing_wait_so_a_job_reporting_faster_than_a_batch_an_interval_drops_nothing():
    # 8 reports a batch, an interval of a whole second, a queue of 16: 64 reports 3 ms apart would fill the queue
    # within one interval (and drop the oldest) if the reporter waited it out with a full batch in.
    _, server, reporter = _posts_for_steps_of(0.003, 1.0, n=64, batch_max=8, queue_max=16)
    assert server.delivered == set(range(64))
    assert reporter.dropped == 0 and len(server.posted("/report-batches")) >= 7, server.posted("/report-batches")


def test_batch_max_1_posts_every_report_alone():
    server = FakeServer()
    reporter = held_reporter(server, batch_max=1)
    try:
        submit_held(server, reporter, range(5))
        eventually(lambda: server.delivered == set(range(5)))
    finally:
        reporter.close()
    assert batch_steps(server) == [] and single_steps(server) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="batch_max"):
        Reporter("http://trimtab.invalid", "fake", batch_max=257)


def test_a_batch_refused_whole_goes_again_one_by_one_and_only_the_bad_report_is_rejected(caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer()
    server.bad_steps = {2}
    reporter = held_reporter(server)
    try:
        submit_held(server, reporter, range(5))
        eventually(lambda: reporter.rejected == 1 and server.delivered == {0, 1, 3, 4})
        lone_then_group(server, reporter, 5, range(6, 9))  # batching resumes once the refused batch is through
        eventually(lambda: server.delivered == {0, 1, 3, 4, 5, 6, 7, 8})
    finally:
        reporter.close()
    assert batch_steps(server) == [[0, 1, 2, 3, 4], [6, 7, 8]]
    assert single_steps(server) == [0, 1, 2, 3, 4, 5]
    assert reporter.sent == 8 and reporter.rejected == 1 and reporter.dropped == 0 and not reporter.offline
    assert len(messages(caplog, "HTTP 422")) == 1  # the bad report's refusal; the batch's is no loss


@pytest.mark.parametrize("mode", ["old", "old405"])
def test_a_server_without_the_batch_route_gets_every_report_one_per_post(mode, caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer(mode)
    reporter = held_reporter(server)
    try:
        queued_then_lone_then_group(server, reporter, 4, 3)
    finally:
        reporter.close()
    assert batch_steps(server) == [[0, 1, 2, 3]]  # asked once, never again
    assert single_steps(server) == list(range(8))
    assert reporter.sent == 8 and reporter.rejected == reporter.dropped == 0
    assert len(server.posted("/v1/jobs")) == 1  # not taken for a job the server forgot
    assert len(messages(caplog, "no batch route")) == 1


def test_a_batch_for_a_job_the_server_forgot_registers_it_again_and_keeps_batching():
    server = FakeServer("forgot")
    reporter = held_reporter(server)
    try:
        submit_held(server, reporter, range(4))
        eventually(lambda: server.delivered == set(range(4)))
    finally:
        reporter.close()
    assert batch_steps(server) == [[0, 1, 2, 3], [0, 1, 2, 3]] and single_steps(server) == []
    assert len(server.posted("/v1/jobs")) == 2 and reporter.sent == 4


def test_without_a_spool_a_failed_batch_is_requeued_whole_within_queue_max():
    server = FakeServer("5xx")
    reporter = held_reporter(server, queue_max=6, spool_max_bytes=0)
    try:
        submit_held(server, reporter, range(5))  # one batch of 5, refused with 503: back at the queue's front
        eventually(lambda: reporter.offline)
        server.gate = threading.Event()
        eventually(lambda: len(server.posted("/report-batches")) == 2)  # held inside its retry
        submit_held(server, reporter, range(5, 9))  # 4 newer reports leave room for 2: the batch's 3 oldest go
        # … unconfirmed, not dropped: a 5xx does not say the server did not store them
        eventually(lambda: reporter.backlog.counts.unconfirmed == 3)
        server.mode = "ok"
        eventually(lambda: server.delivered == set(range(3, 9)))
    finally:
        reporter.close()
    assert reporter.sent == 6 and reporter.dropped == 0 and reporter.rejected == 0
    assert batch_steps(server)[-1] == [3, 4, 5, 6, 7, 8]  # in order: the requeued ones at the front


def test_the_real_api_stores_a_batch_and_refuses_only_its_bad_report(sqlite_api):
    api = sqlite_api
    paths: list[str] = []

    class Recorded(httpx.HTTPTransport):
        def handle_request(self, request):
            paths.append(request.url.path)
            return super().handle_request(request)

    reporter = Reporter(api.url, "real", api.token("job"), registration={"name": "real", "ranks": 1},
                        transport=Recorded())
    try:
        for step in range(10):  # queued faster than the thread registers the job: they go in batches
            reporter.submit({"step": step, "rank": 0, "step_time_s": 1e6 if step == 4 else 0.01})
        eventually(lambda: reporter.sent + reporter.rejected == 10)
    finally:
        reporter.close()
    assert sorted(r["step"] for r in reports_of(api, "real")) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert reporter.rejected == 1 and "/v1/jobs/real/report-batches" in paths
