"""`trimtab check` and ``GET /v1/jobs/{name}`` on learning (issue 41): a job that reports no learning signal is told
why its learning knobs are advice only; a decision on a learning knob shows both verdicts. The jobs are the learning
bench's (bench/learning_staleness.py: a softmax policy trained with PPO's clipped objective, its signals from its own
maths) against a live API with the Rebalancer planning on every report."""

from __future__ import annotations

import json

from click.testing import CliRunner

from bench.learning_staleness import TWINS, run_auto
from bench.live_api import local_api
from trimtab.cli.main import cli
from trimtab.cli.render import verdicts_line

ADVICE = "no learning signal reported: advising only on prefetch"


def _check(url: str, *extra: str):
    res = CliRunner().invoke(cli, ["check", "--server", url, "--window", "3600", *extra])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.stdout


def test_a_quiet_job_is_told_why_and_a_learning_knob_decision_shows_both_verdicts():
    with local_api("learner") as (http, token):
        quiet = run_auto(http, token, TWINS["stale-hurts"], 1, 30.0, "quiet", report_learning=False)
        hurts = run_auto(http, token, TWINS["stale-hurts"], 1, 60.0, "hurts")
        url = str(http.base_url).rstrip("/")
        # the quiet job: its raise advised, not made, and both the API and check say why
        assert quiet["raise"]["outcome"] == "advised" and quiet["final_prefetch"] == 0
        assert http.get("/v1/jobs/quiet").json()["learning_advice"] == ADVICE
        assert http.get("/v1/jobs/hurts").json()["learning_advice"] is None  # it reports its learning
        text = _check(url)
        quiet_section = text[text.index("job quiet"):]
        assert f"learning: {ADVICE}" in quiet_section.split("verdict:")[0]
        assert f"learning: {ADVICE}" not in text[text.index("job hurts"):].split("verdict:")[0]
        # the job whose stale samples leave the clip range: the raise rolled back on learning, both verdicts shown
        d = hurts["raise"]
        assert d["outcome"] == "rolled_back" and d["evidence"]["learning_broken"]["signal"], d
        both = d["evidence"]["verdicts"]
        assert both["learning"].startswith(f"broke: {d['evidence']['learning_broken']['signal']} ")
        assert verdicts_line(both) in text[text.index("job hurts"):]
        doc = json.loads(_check(url, "--json"))
        jobs = {j["name"]: j for j in doc["jobs"]}
        rows = [r for r in jobs["hurts"]["decisions"] if r["id"] == d["id"]]
        assert rows and rows[0]["verdicts"] == both
        assert jobs["quiet"]["learning_advice"] == ADVICE and jobs["hurts"]["learning_advice"] is None
