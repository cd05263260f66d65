"""A rebalancer decision's evidence cites the GPU-time ledger's largest waste the decided action addresses
(control/waste_cite.py), and /v1/decisions and `trimtab check` show it: on the simulated pipeline a prefetch change
addresses the reward waiting for the actor (6 s of every 10 s step), a sync_every change the communication."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trimtab.cli.check_cmd import check
from trimtab.control.plan import NewChange, Plan
from trimtab.control.service import Rebalancer
from trimtab.store import jobs as job_store
from tests.support.pipeline_job import play_ending_now

STEPS = 40


def decide(api, plan: Plan) -> dict:
    job = job_store.get_job(api.ctx.engine, "pipe")
    Rebalancer(api.ctx.engine)._execute(job, plan)
    return api.http.get("/v1/decisions", params={"job": "pipe"}).json()["decisions"][0]["evidence"]


def test_a_decision_cites_the_largest_waste_its_knob_addresses(sqlite_api, monkeypatch):
    play_ending_now(sqlite_api, monkeypatch, STEPS)
    ev = decide(sqlite_api, Plan("raise prefetch", change=NewChange("generation_bound", "prefetch", 1, 2, "gen"),
                                 evidence={"signal": "x"}))
    w = ev["gpu_time_waste"]
    assert ev["signal"] == "x" and w["matched"] == "the action moves prefetch"
    assert (w["role"], w["cause"], w["waiting_for"]) == ("reward", "waiting", "actor")
    # 6 s of each 10 s step; the 40 steps ended 30 s ago, all inside the last 600 s
    assert w["window_s"] == 600.0 and w["gpu_s"] == pytest.approx(6.0 * STEPS, rel=0.02)
    assert w["gpu_hours"] == pytest.approx(w["gpu_s"] / 3600) and "prefetch" in w["action"]
    ev = decide(sqlite_api, Plan("sync less", change=NewChange("communication_bound", "sync_every", 1, 2, "comm")))
    assert (ev["gpu_time_waste"]["cause"], ev["gpu_time_waste"]["role"]) == ("communication", "actor")
    ev = decide(sqlite_api, Plan("more micro", change=NewChange("update_bound", "log_prob_micro_batch", 1, 2, "u")))
    assert ev["gpu_time_waste"]["matched"].startswith("none of the ledger's wastes is addressed by log_prob_micro")
    ev = decide(sqlite_api, Plan("advice", advice_rule="utilization_spread", advice="place the reward apart"))
    assert ev["gpu_time_waste"]["matched"] == "by size (advice names no knob)"
    assert ev["gpu_time_waste"]["what"] == "reward waiting for actor"
    text = CliRunner().invoke(check, ["--db", str(sqlite_api.ctx.engine.url)]).stdout
    assert "addresses 0." in text and "GPU-h reward waiting for actor over the last 600 s" in text


def test_a_failed_ledger_read_leaves_the_decision_and_says_why(sqlite_api, monkeypatch):
    import trimtab.grading.ledger.read as read

    play_ending_now(sqlite_api, monkeypatch, 5)

    def broken(*_a, **_k):
        raise OSError("disk gone")

    monkeypatch.setattr(read, "job_ledger", broken)
    ev = decide(sqlite_api, Plan("raise prefetch", change=NewChange("generation_bound", "prefetch", 1, 2, "gen")))
    assert ev["gpu_time_waste"] == {"unknown": "the ledger could not be read: OSError: disk gone"}
