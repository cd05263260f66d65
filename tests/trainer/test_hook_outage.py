"""A head outage costs no step report: a real server frozen (SIGSTOP) mid-run gets every step once when it
resumes, and the hook's counts say exactly that; the disk spool is bounded (drops past it counted, said once), a
disk error falls back to memory (counted), and several server URLs fail over and back, a knob change two servers
relay applied once. (src/trimtab/trainer/backlog.py, report_spool.py, server_link.py)"""

from __future__ import annotations

import logging
import shutil
import signal
import sqlite3
import time

import httpx
import pytest

from tests.api.conftest import ServedApp
from tests.support.fake_server import ByHost, FakeServer, delivered_in_order, messages
from tests.support.hook_api import KNOBS, reports_of
from tests.support.procs import admin_secret, free_port, stop, trimtab, wait_http
from tests.support.tmpfs import fill
from tests.support.waits import eventually
from tests.trainer.test_hook_failopen import assert_cheap, run_steps
from trimtab.api.app import create_app
from trimtab.trainer import attach
from trimtab.trainer.adapters.phases import lazy_hook


def accounted(stats: dict) -> bool:
    """Every report the loop handed over (or an earlier run left) is in exactly one count."""
    return stats["submitted"] + stats["inherited"] == (stats["sent"] + stats["rejected"] + stats["dropped"]
                                                       + stats["unconfirmed"] + stats["pending"] + stats["left"])


def run_for(hook, seconds: float, sleep_s: float = 0.005) -> tuple[int, list[float]]:
    """Steps for ``seconds``; (how many, each ``step_end``'s cost)."""
    costs: list[float] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        costs += run_steps(hook, 1, sleep_s)
    return len(costs), costs


def stored_rows(db, job: str) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT r.step FROM job_reports r JOIN jobs j ON j.id = r.job_id "
                                           "WHERE j.name = ?", (job,))]


def test_a_server_frozen_mid_run_gets_every_step_once_when_it_resumes_and_the_counts_are_exact(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    port, db = free_port(), tmp_path / "t.db"
    base = f"http://127.0.0.1:{port}"
    server = trimtab("server", "--state-dir", str(tmp_path / "state"), "--db", f"sqlite:///{db}", "--port",
                     str(port), "--no-rebalance")
    hook = None
    try:
        wait_http(f"{base}/healthz", proc=server)
        # A memory queue of 64: the outage's few hundred reports must wait on disk.
        hook = attach("frozen", base, admin_secret(tmp_path / "state"), knobs=KNOBS, queue_max=64,
                      spool_dir=str(tmp_path / "spool"), timeout_s=0.5, backoff_max_s=2.0)
        run_steps(hook, 20)
        eventually(lambda: len(stored_rows(db, "frozen")) == 20, timeout_s=30)  # a loaded machine: a slow start
        server.send_signal(signal.SIGSTOP)  # its port still accepts; nothing answers: every POST times out
        try:
            n, costs = run_for(hook, 5.0, sleep_s=0.01)
            assert hook.stats["offline"] and hook.stats["spooled"] > 0 and n > 200
        finally:
            server.send_signal(signal.SIGCONT)
        run_steps(hook, 20)
        eventually(lambda: hook.stats["pending"] == 0, timeout_s=30)
        hook.close()
        s = hook.stats
    finally:
        if hook is not None:
            hook.close(timeout_s=0.5)
        server.send_signal(signal.SIGCONT)
        stop(server)
    total = 20 + n + 20
    rows = stored_rows(db, "frozen")
    assert sorted(rows) == list(range(total))  # every step, none twice
    assert_cheap(costs)
    assert s["sent"] == total and s["dropped"] == s["unconfirmed"] == s["rejected"] == s["pending"] == 0, s
    assert s["stored"] + s["already_stored"] == s["sent"] and s["late"] >= s["spooled"] > 0 and accounted(s), s
    assert len(messages(caplog, "offline")) == 1 and len(messages(caplog, "back online")) == 1


def fake_hook(server, url: str = "http://trimtab.invalid", **kw):
    return attach("fake", url, "tok", knobs=KNOBS, backoff_max_s=0.2, transport=httpx.MockTransport(server), **kw)


def test_reports_sent_after_an_outage_carry_the_time_their_step_ended(tmp_path):
    """The server files a late report at its ``ended_ms`` (api/routes/job_loop.py): the hook stamps it at the step's
    boundary with the wall clock, not when the report finally goes."""
    server = FakeServer("down")
    hook = fake_hook(server, queue_max=16, spool_dir=str(tmp_path))
    spans = []  # (wall clock before step_end, after) of each step, epoch ms
    try:
        for _ in range(60):
            before = time.time_ns() // 1_000_000
            run_steps(hook, 1, sleep_s=0.01)
            spans.append((before, time.time_ns() // 1_000_000))
        assert hook.stats["spooled"] > 0
        time.sleep(0.3)  # the reports wait: sent at least this long after their steps
        sent_from_ms = time.time_ns() // 1_000_000
        server.mode = "ok"
        eventually(lambda: hook.stats["pending"] == 0)
    finally:
        hook.close(timeout_s=0.5)
    with server.lock:
        reports = [r for m, p, b in server.requests if m == "POST" and p.endswith("/report-batches")
                   for r in b["reports"]] + [b for m, p, b in server.requests if m == "POST" and p.endswith("/reports")]
    ended = {r["step"]: r["ended_ms"] for r in reports}
    assert sorted(ended) == list(range(60))
    assert all(spans[step][0] <= ms <= spans[step][1] < sent_from_ms for step, ms in ended.items()), (ended, spans)


def test_a_full_spool_keeps_its_oldest_and_memory_its_newest_and_counts_the_middle_said_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer("down")  # connection refused: nothing reached the server, so a loss is certain
    cap = 4096
    hook = fake_hook(server, queue_max=32, spool_dir=str(tmp_path), spool_max_bytes=cap)
    try:
        assert_cheap(run_steps(hook, 400, sleep_s=0.002))
        eventually(lambda: hook.stats["dropped"] > 0)
        full = hook.stats
        server.mode = "ok"
        eventually(lambda: hook.stats["pending"] == 0)
    finally:
        hook.close(timeout_s=0.5)
    s, steps = hook.stats, delivered_in_order(server)
    assert steps == sorted(set(steps)) and steps[-32:] == list(range(368, 400))  # in order, once, the newest kept
    assert steps[0] == 0 and 0 < full["spool_bytes_peak"] <= cap  # … and the spool's oldest, within its bound
    # What neither kept is counted, by why: the spool's bound (and, on a loaded machine, a spill that came late).
    assert s["dropped"] == 400 - len(steps) and s["dropped_by"].get("spool_full", 0) > 0, s
    assert set(s["dropped_by"]) <= {"spool_full", "queue_full"} and s["unconfirmed"] == 0 and accounted(s)
    assert s["sent"] == len(steps) and len(messages(caplog, "is full")) == 1


@pytest.mark.parametrize("fault", ["disk full", "spool removed"])
def test_a_disk_error_falls_back_to_memory_counted_and_said_once(fault, tmp_path, small_disk, caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    server = FakeServer("down")
    where = small_disk(256 * 1024) if fault == "disk full" else tmp_path / "spool"
    if fault == "disk full":
        (where / "hook").mkdir()
        fill(where)
        where = where / "hook"
    hook = fake_hook(server, queue_max=8, spool_dir=str(where))
    try:
        assert_cheap(run_steps(hook, 60, sleep_s=0.001))
        if fault == "spool removed":
            eventually(lambda: hook.stats["spooled"] >= 40)
            shutil.rmtree(where)  # an admin's cleanup: what the spool held is gone
        assert_cheap(run_steps(hook, 60, sleep_s=0.001))
        server.mode = "ok"
        eventually(lambda: hook.stats["pending"] == 0)
    finally:
        hook.close(timeout_s=0.5)
    s, steps = hook.stats, delivered_in_order(server)
    assert s["spool_errors"] >= 1 and s["dropped_by"].get("disk_error", 0) > 0 and accounted(s), s
    assert steps == sorted(set(steps)) and steps[-8:] == list(range(112, 120)) and s["sent"] == len(steps)
    assert len(messages(caplog, "cannot use the report spool")) == 1


def stopped(served: ServedApp) -> int:
    """Stops a served API (its port refuses connections from now on); the port, to serve again on."""
    port = served.port
    served.stop()
    served.join()
    return port


def test_reports_fail_over_to_the_next_server_and_come_back(sqlite_api, caplog):
    caplog.set_level(logging.WARNING, logger="trimtab.trainer")
    api = sqlite_api
    a, b = (ServedApp(create_app(api.ctx)).__enter__() for _ in range(2))  # two heads over one store
    hook = attach("twoheads", [a.url, b.url], api.token("job"), knobs=KNOBS, backoff_max_s=0.3)
    stored = lambda n: len(reports_of(api, "twoheads")) == n  # noqa: E731
    try:
        run_steps(hook, 10)
        eventually(lambda: stored(10))
        revived = ServedApp(create_app(api.ctx))
        revived.server.config.port = stopped(a)  # A dies: B takes the reports, at once, nothing said offline
        assert_cheap(run_steps(hook, 30))
        eventually(lambda: stored(40))
        assert hook.stats["server"] == b.url and not hook.stats["offline"]
        with revived:  # A is back, B dies: back to A
            stopped(b)
            assert_cheap(run_steps(hook, 10))
            eventually(lambda: stored(50))
            assert hook.stats["server"] == a.url
    finally:
        hook.close(timeout_s=0.5)
        b.stop()
    assert sorted(r["step"] for r in reports_of(api, "twoheads")) == list(range(50))
    s = hook.stats
    assert s["sent"] == 50 and s["dropped"] == s["unconfirmed"] == 0 and accounted(s)
    assert not messages(caplog, "offline") and messages(caplog, "trying")  # one answered all along


def test_a_knob_change_two_servers_relay_is_applied_once():
    change = {"change_id": 7, "knob": "batch_size", "value": 16, "reason": "the same change, one store"}
    a, b = FakeServer("ok"), FakeServer("ok")
    a.pending = b.pending = [change]  # the ack has not reached the store yet: both still relay it
    hook = fake_hook(ByHost({"a.invalid": a, "b.invalid": b}), url="http://a.invalid, http://b.invalid")
    applied: list = []
    hook.on_change(lambda knob, old, new, cid: applied.append((knob, new, cid)))
    try:
        eventually(lambda: run_steps(hook, 1) and hook.knobs["batch_size"] == 16)
        a.mode = "down"
        run_steps(hook, 5)
        eventually(lambda: run_steps(hook, 1) and len(b.posted("/report-batches") + b.posted("/reports")) >= 3)
        run_steps(hook, 5)
    finally:
        hook.close(timeout_s=0.5)
    assert applied == [("batch_size", 16, 7)] and hook.knobs["batch_size"] == 16
    assert [x["change_id"] for x in a.posted("/acks") + b.posted("/acks")] == [7]


def test_server_urls_come_as_a_list_or_separated_by_commas_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("TRIMTAB_SERVER", "http://a.invalid:1, http://b.invalid:2/")
    hook = lazy_hook(None, "envjob", None, None, knobs=KNOBS)
    try:
        assert hook._reporter.servers == ["http://a.invalid:1", "http://b.invalid:2"]
    finally:
        hook.close(timeout_s=0.1)
    with pytest.raises(ValueError, match="must start with http"):
        attach("bad", "http://a.invalid:1,a.invalid:2")
