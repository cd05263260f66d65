"""`trimtab check` names a job's three largest wastes in GPU-hours with the action for each, from the store and from
a running server alike: on the simulated pipeline, the critic and reward waiting for the actor come first, and the
action is generation batching and prefetch."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trimtab.cli.check_cmd import check
from tests.support.pipeline_job import play_ending_now

STEPS = 55


@pytest.mark.parametrize("via", ["db", "server"])
def test_check_prints_the_three_largest_wastes_with_their_actions(sqlite_api, monkeypatch, via):
    play_ending_now(sqlite_api, monkeypatch, STEPS)
    where = ["--db", str(sqlite_api.ctx.engine.url)] if via == "db" else ["--server", sqlite_api.url]
    result = CliRunner().invoke(check, [*where, "--json"])
    assert result.exit_code in (0, 1, 2), result.output  # 2: the simulated node's samples end in the past (stale)
    g = json.loads(result.stdout)["gpu_time"]["pipe"]
    assert g["gpus"] == 4 and g["busy_gpu_s"] > 0
    top = [(w["role"], w["cause"], w["waiting_for"]) for w in g["wastes"]]
    # per 10 s step: reward waits 6 s for the actor, critic 5.5 s, the actor 2 s (x2 GPUs) for the reward
    assert top == [("reward", "waiting", "actor"), ("critic", "waiting", "actor"), ("actor", "waiting", "reward")]
    assert all(w["gpu_hours"] == pytest.approx(w["gpu_s"] / 3600) for w in g["wastes"])
    assert "batch size" in g["wastes"][0]["action"] and "prefetch" in g["wastes"][0]["action"]
    assert "reward model" in g["wastes"][2]["action"]
    text = CliRunner().invoke(check, where).stdout
    assert "largest wastes:" in text and "1. " in text and "GPU-h  reward waiting for actor" in text
