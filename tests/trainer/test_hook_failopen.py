"""Fail-open: whatever the server does — dies, hangs, answers garbage, 5xx, 4xx, forgets the job, or sends a
change the job cannot take — the training loop keeps its pace, says once that the server is offline, and reports
resume when it is back. And the reporter's batches: several queued reports in one POST, a batch refused whole
sent again one report at a time, and one POST per report to a server without the batch route."""

from __future__ import annotations

import json
import logging
import socket
import statistics
import threading
import time

import httpx
import pytest

from tests.api.conftest import ServedApp
from tests.support.hook_api import KNOBS, reports_of
from tests.support.waits import eventually
from trimtab.api.app import create_app
from trimtab.trainer import attach
from trimtab.trainer.server_link import Reporter

MEDIAN_BOUND_S = 0.002  # loose on purpose: the real cost is ~10 µs; what must not happen is waiting on I/O
MAX_BOUND_S = 0.2  # no single call may wait for an HTTP timeout (1 s)


def run_steps(hook, n: int, sleep_s: float = 0.002) -> list[float]:
    """Runs ``n`` steps; returns how long each ``step_end`` took."""
    costs = []
    for _ in range(n):
        with hook.phase("generation"):
            time.sleep(sleep_s)
        t0 = time.perf_counter()
        hook.step_end(samples=hook.knobs["batch_size"])
        costs.append(time.perf_counter() - t0)
    return costs


def assert_cheap(costs: list[float]) -> None:
    assert statistics.median(costs) < MEDIAN_BOUND_S and max(costs) < MAX_BOUND_S, (statistics.median(costs),
                                                                                     max(costs))


def messages(caplog, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if word in r.getMessage()]


def test_the_server_killed_mid_run_costs_nothing_is_said_once_and_reports_resume_after_restart(sqlite_api, caplog):
    api = sqlite_api
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    served = ServedApp(create_app(api.ctx)).__enter__()  # our own server over the test's store: we kill it
    hook = attach("survivor", served.url, api.token("job"), knobs=KNOBS, backoff_max_s=0.3)
    try:
        run_steps(hook, 10)
        eventually(lambda: len(reports_of(api, "survivor")) == 10)
        port = served.port
        served.stop()
        served.join()
        assert_cheap(run_steps(hook, 150))
        eventually(lambda: hook.stats["offline"])
        assert_cheap(run_steps(hook, 50))
        assert len(messages(caplog, "offline")) == 1, messages(caplog, "offline")
        revived = ServedApp(create_app(api.ctx))
        revived.server.config.port = port  # the same address the hook knows
        with revived:
            eventually(lambda: not hook.stats["offline"] and hook.stats["queued"] == 0)
            run_steps(hook, 5)
            steps = eventually(lambda: (s := {r["step"] for r in reports_of(api, "survivor")}) >= {214} and s)
    finally:
        hook.close(timeout_s=0.5)
    assert steps == set(range(215))  # nothing lost: the queue (256) held the outage's 200 reports
    assert len(messages(caplog, "offline")) == 1 and len(messages(caplog, "back online")) == 1


class FakeServer:
    """An httpx MockTransport handler standing in for the API; ``mode`` says how it misbehaves ("old": a server
    without the batch route, which FastAPI answers 404 "Not Found"; "old405": 405 "Method Not Allowed").
    ``bad_steps``: reports it refuses (422), a batch holding one whole. ``gate``: while set, each request waits
    for it to open (the reporter thread is held inside its request while the test queues reports)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.pending: list = []
        self.delivered: set[int] = set()  # steps whose report got a proper answer
        self.requests: list[tuple[str, str, dict]] = []
        self.bad_steps: set[int] = set()
        self.gate: threading.Event | None = None
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        with self.lock:
            self.requests.append((request.method, request.url.path, body))
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        if request.method == "GET":
            return httpx.Response(404, json={"detail": "no job"})
        if request.url.path == "/v1/jobs":
            return httpx.Response(201, json={"name": body["name"]})
        if self.mode == "garbage":
            return httpx.Response(200, text="<html>proxy error</html>")
        if self.mode == "5xx":
            return httpx.Response(503, text="upstream unavailable")
        if self.mode == "422":
            return httpx.Response(422, json={"detail": [{"loc": ["body", "step"], "msg": "bad"}]})
        batch = request.url.path.endswith("/report-batches")
        if batch and self.mode in ("old", "old405"):
            return httpx.Response(404, json={"detail": "Not Found"}) if self.mode == "old" else httpx.Response(
                405, json={"detail": "Method Not Allowed"}, headers={"Allow": "GET"})
        reports = body["reports"] if batch else [body] if request.url.path.endswith("/reports") else []
        if self.mode == "forgot" and reports:
            self.mode = "ok"  # a fresh store: it knows nothing until the job registers again
            return httpx.Response(404, json={"detail": "no job named 'fake'"})
        bad = [i for i, r in enumerate(reports) if r["step"] in self.bad_steps]
        if bad:
            loc = ["body", "reports", bad[0], "step_time_s"] if batch else ["body", "step_time_s"]
            return httpx.Response(422, json={"detail": [{"loc": loc, "msg": "bad", "type": "value_error"}]})
        self.delivered.update(r["step"] for r in reports)
        stored = {"stored": len(reports), "received": len(reports)} if batch else {"stored": True}
        return httpx.Response(200, json={**stored, "pending_changes": self.pending})

    def posted(self, suffix: str) -> list[dict]:
        with self.lock:
            return [b for m, p, b in self.requests if m == "POST" and p.endswith(suffix)]


def fake_hook(server: FakeServer, **kw):
    return attach("fake", "http://trimtab.invalid", "tok", knobs=KNOBS, backoff_max_s=0.2,
                  transport=httpx.MockTransport(server), **kw)


@pytest.mark.parametrize("mode", ["garbage", "5xx"])
def test_garbage_and_5xx_answers_are_retried_until_the_server_recovers(mode, caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer(mode)
    hook = fake_hook(server)
    try:
        assert_cheap(run_steps(hook, 30))
        eventually(lambda: hook.stats["offline"])
        server.mode = "ok"
        eventually(lambda: server.delivered == set(range(30)))
    finally:
        hook.close(timeout_s=0.5)
    assert len(messages(caplog, "offline")) == 1 and len(messages(caplog, "back online")) == 1


def test_a_server_that_never_answers_times_out_in_the_background_and_close_is_bounded(caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections (the kernel does) and never answers a byte
    try:
        hook = attach("hung", f"http://127.0.0.1:{silent.getsockname()[1]}", "tok", knobs=KNOBS)
        assert_cheap(run_steps(hook, 100))
        eventually(lambda: hook.stats["offline"], timeout_s=5)
        t0 = time.monotonic()
        hook.close(timeout_s=0.5)
        assert time.monotonic() - t0 < 2.5  # at most one in-flight request (1 s timeout) outlives the flush
    finally:
        silent.close()
    assert "ReadTimeout" in messages(caplog, "offline")[0]


def test_refused_reports_are_dropped_and_counted_not_retried_forever(caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer("422")
    hook = fake_hook(server)
    try:
        run_steps(hook, 5)
        eventually(lambda: hook.stats["rejected"] == 5)
        assert len(server.posted("/reports")) == 5 and not hook.stats["offline"]
    finally:
        hook.close(timeout_s=0.5)
    assert len(messages(caplog, "HTTP 422")) == 1


def test_a_server_that_forgot_the_job_gets_it_registered_again():
    server = FakeServer("forgot")
    hook = fake_hook(server)
    try:
        run_steps(hook, 3)
        eventually(lambda: server.delivered == {0, 1, 2})
    finally:
        hook.close(timeout_s=0.5)
    assert len(server.posted("/v1/jobs")) == 2  # the first registration, and again after the 404


def test_the_queue_keeps_the_newest_reports_and_counts_what_it_dropped():
    server = FakeServer("5xx")
    hook = fake_hook(server, queue_max=10)
    try:
        run_steps(hook, 50, sleep_s=0)
        server.mode = "ok"
        eventually(lambda: set(range(40, 50)) <= server.delivered)
    finally:
        hook.close(timeout_s=0.5)
    assert hook.stats["dropped"] >= 39 and len(server.delivered) <= 11


def test_a_change_outside_the_jobs_own_bounds_is_refused_with_a_reason_and_not_acked(caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer("ok")
    server.pending = [{"change_id": 7, "knob": "batch_size", "value": 500, "reason": "a confused server"},
                      {"change_id": 5, "knob": "prefetch", "value": 2.5, "reason": "not an integer"}]
    hook = fake_hook(server)
    try:
        run_steps(hook, 3)
        eventually(lambda: "change 5" in caplog.text)
        run_steps(hook, 2)
        server.pending = [{"change_id": 8, "knob": "prefetch", "value": 3.0, "reason": "fine"}]
        eventually(lambda: run_steps(hook, 1) and hook.knobs["prefetch"] == 3)
    finally:
        hook.close(timeout_s=0.5)
    assert hook.knobs["batch_size"] == 8 and type(hook.knobs["prefetch"]) is int  # 3.0 arrives as an int
    assert "outside the job's bounds [1, 64]" in caplog.text and "has a fraction" in caplog.text
    assert [a["change_id"] for a in server.posted("/acks")] == [8]


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
        submit_held(server, reporter, range(7))
        eventually(lambda: server.delivered == set(range(7)))
        lone_then_group(server, reporter, 7, range(8, 10))
        eventually(lambda: server.delivered == set(range(10)))
    finally:
        reporter.close()
    assert batch_steps(server) == [[0, 1, 2], [3, 4, 5], [8, 9]]
    assert single_steps(server) == [6, 7]  # the one left over, and the one queued alone
    assert reporter.sent == 10 and reporter.rejected == reporter.dropped == 0 and len(got) == 5


def _posts_for_steps_of(step_s: float, min_interval_s: float, n: int = 40) -> tuple[int, set]:
    """How many report POSTs ``n`` reports ``step_s`` apart took (the server answers at once)."""
    server = FakeServer()
    reporter = Reporter("http://trimtab.invalid", "fake", "tok", registration={"name": "fake", "ranks": 1},
                        transport=httpx.MockTransport(server), min_interval_s=min_interval_s)
    try:
        for step in range(n):
            reporter.submit({"step": step, "rank": 0, "step_time_s": step_s})
            time.sleep(step_s)
        eventually(lambda: server.delivered == set(range(n)))
    finally:
        reporter.close()
    return len(server.posted("/reports")) + len(server.posted("/report-batches")), server.delivered


def test_posts_are_paced_so_the_reports_of_steps_shorter_than_the_interval_go_together():
    # 40 steps of 5 ms: unpaced, a POST per report or nearly (the fake server answers at once); paced at 50 ms, a
    # POST at most every 50 ms for 0.2 s of steps (5 or so), every report still delivered.
    unpaced, _ = _posts_for_steps_of(0.005, 0.0)
    paced, delivered = _posts_for_steps_of(0.005, 0.05)
    assert unpaced >= 20 and paced <= 10 and delivered == set(range(40)), (unpaced, paced)
    # Steps longer than the interval: one POST per report, as before.
    slow, _ = _posts_for_steps_of(0.08, 0.05, n=6)
    assert slow == 6


def test_a_full_batch_ends_the_pacing_wait_so_a_job_reporting_faster_than_a_batch_an_interval_drops_nothing():
    # 8 reports a batch, an interval of a whole second, a queue of 16: 64 reports 3 ms apart would fill the queue
    # within one interval (and drop the oldest) if the reporter waited it out with a full batch in.
    server = FakeServer()
    reporter = Reporter("http://trimtab.invalid", "fake", "tok", registration={"name": "fake", "ranks": 1},
                        transport=httpx.MockTransport(server), min_interval_s=1.0, batch_max=8, queue_max=16)
    try:
        for step in range(64):
            reporter.submit({"step": step, "rank": 0, "step_time_s": 0.003})
            time.sleep(0.003)
        eventually(lambda: server.delivered == set(range(64)))
    finally:
        reporter.close()
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
        submit_held(server, reporter, range(4))
        eventually(lambda: server.delivered == set(range(4)))
        lone_then_group(server, reporter, 4, range(5, 8))
        eventually(lambda: server.delivered == set(range(8)))
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


def test_a_failed_batch_is_requeued_whole_within_queue_max():
    server = FakeServer("5xx")
    reporter = held_reporter(server, queue_max=6)
    try:
        submit_held(server, reporter, range(5))  # one batch of 5, refused with 503: back at the queue's front
        eventually(lambda: reporter.offline)
        server.gate = threading.Event()
        eventually(lambda: len(server.posted("/report-batches")) == 2)  # held inside its retry
        submit_held(server, reporter, range(5, 9))  # 4 newer reports leave room for 2: the batch's 3 oldest go
        eventually(lambda: reporter.dropped == 3)
        server.mode = "ok"
        eventually(lambda: server.delivered == set(range(3, 9)))
    finally:
        reporter.close()
    assert reporter.sent == 6 and reporter.dropped == 3 and reporter.rejected == 0
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
