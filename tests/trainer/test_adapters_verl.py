"""``trimtab verl-tail``: verl's own ``file`` logger output — written by verl 0.9.1's real fit loops running on CPU
(``tests/trainer/verl_harness.py``; nothing of it is written by hand here) — becomes step reports: the validation
line before training is no step, validation and checkpointing are phases of their own and count in the step time,
V1's replay-buffer wait is a wait, and the follower survives partial lines, rotation and a restart."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.support.frameworks import require

require("verl")

from tests.support.hook_api import reports_of  # noqa: E402
from tests.support.waits import eventually  # noqa: E402
from tests.trainer.verl_legacy_harness import run_legacy_fit  # noqa: E402
from tests.trainer.verl_v1_sync_harness import run_v1_fit  # noqa: E402
from trimtab.trainer.adapters.verl import VerlTailer, parse_device_map, record_to_report, tail_verl  # noqa: E402


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    """One legacy run: validation before training, a test step and a checkpoint step."""
    return run_legacy_fit(tmp_path_factory.mktemp("legacy"), steps=4, test_freq=2, save_freq=3,
                          overrides=["trainer.val_before_train=True"])


@pytest.fixture(scope="module")
def v1_run(tmp_path_factory):
    return run_v1_fit(tmp_path_factory.mktemp("v1"), steps=3, test_freq=3, step_s=0.02)


def timers(record: dict) -> dict:
    return {k[len("timing_s/"):]: v for k, v in record["data"].items() if k.startswith("timing_s/")}


def test_a_legacy_line_maps_verls_timers_to_phases_with_validation_in_the_step(legacy_run):
    first, *steps = legacy_run.records
    assert first["step"] == 0 and record_to_report(first, trainer="legacy") is None  # validation before training
    tested = next(r for r in steps if "testing" in timers(r))
    t = timers(tested)
    report = record_to_report(tested, hostname="node-a", trainer="legacy")
    assert report.step == tested["step"] and report.hostname == "node-a"
    assert report.step_time_s == pytest.approx(t["step"] + t["testing"] + t["start_profile"] + t["stop_profile"])
    assert report.phases_s["validation"] == t["testing"] and report.phases_s["generation"] == t["gen"]
    assert "wait" not in report.phases_s
    assert report.phases_s["evaluation"] == pytest.approx(t["reward"] + t["ref"] + t["values"] + t["old_log_prob"])
    assert report.phases_s["update"] == pytest.approx(t["update_actor"] + t["update_critic"] + t["adv"])
    assert report.phases_s["communication"] == t["update_weights"]
    assert sum(report.phases_s.values()) == pytest.approx(report.step_time_s)
    d = tested["data"]
    assert report.tokens == d["perf/total_num_tokens"]
    assert report.samples == round(d["perf/total_num_tokens"] / (d["prompt_length/mean"] + d["response_length/mean"]))
    assert report.samples == 8  # 4 prompts × rollout.n 2
    assert report.rollout_slowest_s == t["agent_loop/slowest/generate_sequences"]
    assert report.memory is not None and set(report.memory) == {"allocated_bytes", "reserved_bytes"}
    saved = next(r for r in steps if "save_checkpoint" in timers(r))
    assert record_to_report(saved, trainer="legacy").phases_s["checkpoint"] == timers(saved)["save_checkpoint"]
    assert record_to_report(tested, samples_per_step=256, trainer="legacy").samples == 256


def test_a_v1_line_reports_the_replay_buffer_wait_as_a_wait(v1_run):
    record = v1_run.records[-1]
    t = timers(record)
    report = record_to_report(record)  # V1 is the default, as in verl
    assert report.phases_s["wait"] == t["gen"] and "generation" not in report.phases_s
    assert report.step_time_s == pytest.approx(t["step"] + t["testing"])


def test_the_tailer_follows_verl_through_partial_lines_rotation_and_a_restart(legacy_run, tmp_path):
    lines = [json.dumps(r) + "\n" for r in legacy_run.records]  # verl's lines, as its FileLogger wrote them
    log = tmp_path / "ppo.jsonl"
    tailer = VerlTailer(log, trainer="legacy")
    assert tailer.poll() == []  # verl has not created its log yet
    with open(log, "wb", buffering=0) as f:  # as verl's FileLogger writes: unbuffered bytes
        f.write("".join(lines[:3]).encode() + lines[3][:100].encode())
        assert [r.step for r in tailer.poll()] == [1, 2]  # line 0 is the validation line; step 3 is half written
        f.write(lines[3][100:].encode())
        assert [r.step for r in tailer.poll()] == [3]
        f.write(lines[4][:50].encode())  # the run is killed halfway through step 4
        assert tailer.poll() == []
    os.rename(log, tmp_path / "ppo.jsonl.1")  # logrotate; the resumed run starts a new file
    log.write_text("".join(lines[3:5]))
    assert [r.step for r in tailer.poll()] == [3, 4]
    with open(log, "wb", buffering=0) as f:  # resumed again in place: verl opens its log with "wb"
        f.write(lines[4].encode())
    assert [r.step for r in tailer.poll()] == [4]
    f = tailer.follower
    assert (f.rotations, f.truncations, f.partial_lines_dropped, tailer.bad_lines) == (1, 1, 1, 0)


def test_tailed_steps_reach_the_live_api_without_overwriting_the_jobs_own_declaration(sqlite_api, legacy_run):
    api = sqlite_api
    token = api.token("job")
    declared = {"name": "verl-grpo", "ranks": 1, "knobs": {"log_prob_micro_batch": {"value": 2, "min": 1, "max": 8}}}
    assert api.post("/v1/jobs", declared, token=token).status_code == 201  # as the plugin inside verl would
    stop = threading.Event()
    tail = threading.Thread(target=tail_verl, args=(legacy_run.jsonl, "verl-grpo", api.url, token),
                            kwargs={"device_map": parse_device_map(["actor=0,1", "critic=2"]), "poll_s": 0.05,
                                    "stop": stop, "trainer": "legacy"})
    tail.start()
    try:
        reports = eventually(lambda: len(reports_of(api, "verl-grpo")) == 4 and reports_of(api, "verl-grpo"))
    finally:
        stop.set()
        tail.join(5)
    assert [r["step"] for r in reports] == [4, 3, 2, 1]
    by_step = {r["step"]: r for r in reports}
    assert by_step[2]["validation_s"] > 0 and by_step[1]["validation_s"] is None
    assert all(r["samples"] == 8 and r["generation_s"] > 0 and r["update_s"] > 0 for r in reports)
    assert api.get("/v1/jobs/verl-grpo").json()["knobs"]["log_prob_micro_batch"]["max"] == 8  # untouched


def test_device_maps_parse_and_a_bad_one_says_what_it_wants():
    assert parse_device_map(["actor=0,1", "critic=2"]) == {"actor": [0, 1], "critic": [2]}
    with pytest.raises(ValueError, match="COMPONENT=GPU"):
        parse_device_map(["actor"])
