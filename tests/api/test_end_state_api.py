"""A job's end state on ``GET /v1/jobs/{name}`` and in `trimtab check` (from the store and from a server alike): the
simulated pipeline's four GPUs with their bands, its steady 10 s steps (variation 0), and scaling unknown — it never
ran at another GPU count — with the word that follows."""

from __future__ import annotations

import json
import statistics
import time

import pytest
from click.testing import CliRunner

from trimtab.cli.check_cmd import check
from trimtab.grading.end_state import band_of
from trimtab.grading.rules import default_rules
from trimtab.store import ledger as ledger_store
from tests.support.pipeline_job import play, play_ending_now

STEPS = 40


@pytest.mark.parametrize("via", ["db", "server"])
def test_get_job_and_check_give_the_end_state(sqlite_api, monkeypatch, via):
    play_ending_now(sqlite_api, monkeypatch, STEPS)
    e = sqlite_api.http.get("/v1/jobs/pipe").json()["end_state"]
    assert e["window_s"] == 300.0 and e["util_band_pct"] == [60.0, 75.0] and e["step_cv_max_pct"] == 5.0
    assert e["end_ms"] - e["start_ms"] == 300_000 and e["end_ms"] <= time.time() * 1000
    assert 29 <= e["steps"] <= 31 and e["step_time_cv_pct"] == 0.0 and e["step_time_mean_s"] == 10.0
    s = e["scaling"]
    assert s["efficiency"] is None and s["gpus"] == 4 and s["samples_per_s_per_gpu"] == pytest.approx(0.8)
    assert "no steps at another GPU count than 4" in s["source"]
    roles = {(g["gpu"], g["role"]) for g in e["gpus"]}
    assert roles == {(0, "actor"), (1, "actor"), (2, "critic"), (3, "reward")}
    stored = ledger_store.utilization(sqlite_api.ctx.engine, [("pipe-node", g) for g in range(4)], e["start_ms"],
                                      e["end_ms"])
    for g in e["gpus"]:  # each GPU's mean over exactly the window's samples, and its band from the rules
        utils = [u for _, u in stored[("pipe-node", g["gpu"])]]
        assert g["samples"] == len(utils) > 500 and g["mean_util_pct"] == pytest.approx(statistics.fmean(utils))
        assert g["band"] == band_of(g["mean_util_pct"], default_rules().controller)
    off = [g for g in e["gpus"] if g["band"] != "in"]
    assert (e["status"], e["word"].startswith("not yet: utilization outside 60–75 %")) == \
        (("not_yet", True) if off else ("at_end_state", False))
    where = ["--db", str(sqlite_api.ctx.engine.url)] if via == "db" else ["--server", sqlite_api.url]
    result = CliRunner().invoke(check, [*where, "--json"])
    assert result.exit_code in (0, 1, 2), result.output
    assert json.loads(result.stdout)["end_state"]["pipe"] == e
    text = CliRunner().invoke(check, where).stdout
    assert f"end state over the last 300 s: {e['word']}" in text
    assert "step time variation: 0.0 % over" in text and "scaling: unknown: no steps at another GPU count" in text


def test_the_job_list_leaves_the_end_state_out(sqlite_api, monkeypatch):
    play(sqlite_api, monkeypatch, int(time.time() * 1000) - 100_000, steps=3, name="pipe")
    assert [j["end_state"] for j in sqlite_api.http.get("/v1/jobs").json()["jobs"]] == [None]
