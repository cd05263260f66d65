"""The planner never blocks ingest (issue 39): the planning process runs at low CPU priority, so on a busy machine
the kernel can leave it waiting at any point of a plan. It must never wait there holding SQLite's write lock — it
only reads, and the daemon's process makes its writes (control/plan_writes.py). Here the planning process is
paused at the start of every transaction it opens during a plan, as a busy kernel could pause it, and a job's report
is posted at each pause: every one is stored at once, and the plan's decision still reaches the job."""

from __future__ import annotations

import functools
import itertools
import time
from pathlib import Path

from tests.support.loop_job import JOB, report
from trimtab.control.plan_process import PlanProcess
from trimtab.control.service import Rebalancer

PAUSE_MAX_S = 30.0
REPORTS_MAX = 40  # reports posted at the first pauses


def pause_in_every_transaction(folder: str, rebalancer) -> None:
    """(In the planning process.) After each BEGIN: say so with a file ``paused-N`` and wait for ``go-N``."""
    from sqlalchemy import event

    numbers = itertools.count()

    @event.listens_for(rebalancer.engine, "begin")
    def pause(_conn) -> None:
        n = next(numbers)
        (Path(folder) / f"paused-{n}").touch()
        deadline = time.monotonic() + PAUSE_MAX_S
        while not (Path(folder) / f"go-{n}").exists() and time.monotonic() < deadline:
            time.sleep(0.005)


def test_a_report_is_stored_at_once_while_the_planning_process_is_paused_in_any_of_its_transactions(
        sqlite_api, tmp_path):
    folder = tmp_path / "pauses"
    folder.mkdir()
    rb = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules, interval_s=3600).start(own_process=True)
    rb._apart = PlanProcess(rb.engine, rb.rules, writes=rb.writes,
                            child_setup=functools.partial(pause_in_every_transaction, str(folder)))
    sqlite_api.ctx.after_report, sqlite_api.ctx.after_refusal = rb.after_report, rb.after_refusal
    try:
        assert sqlite_api.post("/v1/jobs", JOB, scope="job").status_code == 201
        r = sqlite_api.post("/v1/jobs/ppo/reports", report(0), scope="job")  # completes a window: a plan is queued
        assert r.status_code == 200, r.text
        step, waits, pauses = 1, [], 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (folder / f"paused-{pauses}").exists():  # the plan is paused inside a transaction: ingest now
                if pauses < REPORTS_MAX:  # (each report may queue another plan: the first ones are enough)
                    start = time.monotonic()
                    r = sqlite_api.post("/v1/jobs/ppo/reports", report(step), scope="job")
                    waits.append((pauses, r.status_code, round(time.monotonic() - start, 2)))
                    step += 1
                (folder / f"go-{pauses}").touch()
                pauses += 1
            elif pauses and rb.wait_planned(0.01):
                break
            else:
                time.sleep(0.005)
        assert pauses >= 3, f"the plan opened {pauses} transactions: it was not paused in the middle"
        # busy_timeout is 5 s: a report that waited for the planning process's write lock takes that long or fails
        slow = [w for w in waits if w[1] != 200 or w[2] > 2.0]
        assert not slow, f"reports held up while the plan was paused (pause, HTTP status, seconds): {slow}"
        assert rb.wait_planned(1)
        r = sqlite_api.post("/v1/jobs/ppo/reports", report(step), scope="job")
        assert [(c["knob"], c["value"]) for c in r.json()["pending_changes"]] == [("batch_size", 4)]
        assert rb.stats.errors == 0, rb.stats.last_error
    finally:
        rb.stop()
