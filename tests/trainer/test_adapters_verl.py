"""verl without changing verl: its file logger's JSONL (recorded in verl's exact format, with the validation line
before training, a line cut off when the run was killed, and the resumed run's file) becomes step reports; and
the knob mixin writes ``batch_size`` into a verl-shaped config between steps."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path

import pytest

from tests.trainer.test_hook_live import eventually, reports_of
from trimtab.trainer.adapters.verl import VerlTailer, parse_device_map, record_to_report, tail_verl
from trimtab.trainer.adapters.verl_knobs import TrimtabVerlMixin, VerlKnobApplier

DATA = Path(__file__).parent / "data"
RUN = (DATA / "verl_ppo_gsm8k.jsonl").read_text()  # steps 0 (validation) to 4, then half of step 5
RESUMED = (DATA / "verl_ppo_gsm8k.resumed.jsonl").read_text()  # steps 5 to 7 after resuming


def test_a_verl_line_maps_its_timers_to_phases_and_its_tokens_to_samples():
    record = json.loads(RUN.splitlines()[1])
    d = record["data"]
    report = record_to_report(record, hostname="node-a")
    t = {k.split("/", 1)[1]: v for k, v in d.items() if k.startswith("timing_s/")}
    assert report.step == 1 and report.step_time_s == t["step"]
    assert report.phases_s["generation"] == t["gen"]
    assert report.phases_s["evaluation"] == pytest.approx(t["reward"] + t["ref"] + t["values"] + t["old_log_prob"])
    assert report.phases_s["update"] == pytest.approx(t["update_actor"] + t["update_critic"] + t["adv"])
    assert report.phases_s["communication"] == t["update_weights"]
    assert report.phases_s["other"] == pytest.approx(t["step"] - sum(v for k, v in t.items() if k != "step"))
    assert report.tokens == d["perf/total_num_tokens"] and report.samples == 128 * 8  # prompts × responses
    assert record_to_report(json.loads(RUN.splitlines()[0])) is None  # the validation line is not a step
    assert record_to_report(record, samples_per_step=256).samples == 256
    no_total = {"step": 2, "data": {"timing_s/step": 10.0, "perf/throughput": 100.0}}
    assert record_to_report(no_total, n_gpus=8).tokens == 8000 and record_to_report(no_total).tokens is None


def test_the_tailer_follows_verl_through_partial_lines_rotation_and_a_restart(tmp_path):
    log = tmp_path / "ppo.jsonl"
    tailer = VerlTailer(log)
    assert tailer.poll() == []  # verl has not created its log yet
    lines = RUN.splitlines(keepends=True)
    with open(log, "wb", buffering=0) as f:  # as verl's FileLogger writes: unbuffered bytes
        f.write("".join(lines[:3]).encode() + lines[3][:100].encode())
        assert [r.step for r in tailer.poll()] == [1, 2]  # step 3 is still being written
        f.write(lines[3][100:].encode() + lines[4].encode())
        assert [r.step for r in tailer.poll()] == [3, 4]
        f.write(lines[5].encode())  # the run is killed halfway through step 5
        assert tailer.poll() == []
    os.rename(log, tmp_path / "ppo.jsonl.1")  # logrotate; the resumed run starts a new file
    log.write_text(RESUMED)
    assert [r.step for r in tailer.poll()] == [5, 6, 7]
    with open(log, "wb", buffering=0) as f:  # resumed again in place: verl opens its log with "wb"
        f.write(RESUMED.splitlines(keepends=True)[0].encode())
    assert [r.step for r in tailer.poll()] == [5]
    f = tailer.follower
    assert (f.rotations, f.truncations, f.partial_lines_dropped, tailer.bad_lines) == (1, 1, 1, 0)


def test_tailed_steps_reach_the_live_api_without_overwriting_the_jobs_own_declaration(sqlite_api, tmp_path):
    api = sqlite_api
    token = api.token("job")
    declared = {"name": "verl-grpo", "ranks": 1, "knobs": {"batch_size": {"value": 8, "min": 1, "max": 32}}}
    assert api.post("/v1/jobs", declared, token=token).status_code == 201  # as the mixin inside verl would
    log = tmp_path / "experiment.jsonl"
    log.write_text(RUN)
    stop = threading.Event()
    tail = threading.Thread(target=tail_verl, args=(log, "verl-grpo", api.url, token),
                            kwargs={"device_map": parse_device_map(["actor=0,1", "critic=2"]), "poll_s": 0.05,
                                    "stop": stop})
    tail.start()
    try:
        reports = eventually(lambda: len(reports_of(api, "verl-grpo")) == 4 and reports_of(api, "verl-grpo"))
    finally:
        stop.set()
        tail.join(5)
    assert [r["step"] for r in reports] == [4, 3, 2, 1]
    assert all(r["samples"] == 1024 and r["generation_s"] > 10 and r["communication_s"] > 1 for r in reports)
    assert api.get("/v1/jobs/verl-grpo").json()["knobs"]["batch_size"]["max"] == 32  # untouched


class StructConfig(MutableMapping):
    """OmegaConf-like: attribute and item access, nested nodes, and struct mode (no new keys)."""

    def __init__(self, content: dict):
        object.__setattr__(self, "_content", {k: StructConfig(v) if isinstance(v, dict) else v
                                              for k, v in content.items()})

    def __getattr__(self, key):
        try:
            return self._content[key]
        except KeyError:
            raise AttributeError(key) from None

    def __getitem__(self, key):
        return self._content[key]

    def __setitem__(self, key, value):
        if key not in self._content:
            raise KeyError(f"struct mode: no new key {key!r}")
        self._content[key] = value

    def __delitem__(self, key):
        raise KeyError(key)

    def __iter__(self):
        return iter(self._content)

    def __len__(self):
        return len(self._content)


def verl_config() -> dict:
    return {
        "data": {"train_batch_size": 128},
        "trainer": {"experiment_name": "qwen-ppo"},
        "actor_rollout_ref": {
            "actor": {"ppo_micro_batch_size_per_gpu": 8, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 16384},
            "rollout": {"n": 8, "log_prob_micro_batch_size_per_gpu": 8, "log_prob_use_dynamic_bsz": False,
                        "log_prob_max_token_len_per_gpu": 16384, "gpu_memory_utilization": 0.6},
            "ref": {"log_prob_micro_batch_size_per_gpu": 8, "log_prob_use_dynamic_bsz": False,
                    "log_prob_max_token_len_per_gpu": 16384},
        },
        "critic": {"ppo_micro_batch_size_per_gpu": 8, "forward_micro_batch_size_per_gpu": 8, "use_dynamic_bsz": False,
                   "ppo_max_token_len_per_gpu": 32768, "forward_max_token_len_per_gpu": 32768},
        "reward_model": {"micro_batch_size_per_gpu": None, "use_dynamic_bsz": False},
    }


@pytest.mark.parametrize("wrap", [dict, StructConfig], ids=["dict", "omegaconf-like"])
def test_the_batch_size_knob_sets_micro_batches_or_scales_dynamic_token_budgets(wrap):
    config = wrap(verl_config())
    applier = VerlKnobApplier(config)
    assert applier.base_batch_size == 8
    changed = applier.apply({"batch_size": 16, "prefetch": 2})
    assert changed == {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 32768,  # dynamic: tokens scale
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
                       "critic.ppo_micro_batch_size_per_gpu": 16, "critic.forward_micro_batch_size_per_gpu": 16}
    assert config["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] == 8  # ignored under dynamic bsz
    assert config["reward_model"]["micro_batch_size_per_gpu"] is None  # unset stays unset
    assert config["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"] == 0.6  # needs a restart: untouched
    assert applier.apply({"batch_size": 16}) == {}  # nothing to do twice
    only_rollout = VerlKnobApplier(wrap(verl_config()), sections=["actor_rollout_ref.rollout"])
    rollout_only = ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"]
    assert list(only_rollout.apply({"batch_size": 4})) == rollout_only


class FakeVerlTrainer:
    """The slice of verl's ``PPOTrainer`` the mixin relies on: config, global_steps, timing_raw and hooks."""

    def __init__(self, config):
        self.config, self.global_steps, self.timing_raw, self.hook_calls = config, 0, {}, []

    def on_train_begin(self):
        self.hook_calls.append("train_begin")

    def on_step_end(self):
        self.hook_calls.append("step_end")

    def on_train_end(self):
        self.hook_calls.append("train_end")


def test_the_mixin_reports_verls_timers_and_applies_a_queued_change_between_steps(sqlite_api):
    api = sqlite_api

    class Trainer(TrimtabVerlMixin, FakeVerlTrainer):
        trimtab_server, trimtab_token = api.url, api.token("job")
        trimtab_bounds = {"batch_size": (1, 32)}

    trainer = Trainer(StructConfig(verl_config()))
    trainer.on_train_begin()
    eventually(lambda: api.get("/v1/jobs/qwen-ppo").status_code == 200)  # job name: trainer.experiment_name
    api.post("/v1/jobs/qwen-ppo/changes", {"knob": "batch_size", "value": 16}, token=api.admin_token)

    def step() -> int:
        trainer.global_steps += 1
        trainer.timing_raw = {"gen": 0.02, "reward": 0.001, "ref": 0.002, "update_actor": 0.003}
        trainer.on_step_end()
        time.sleep(0.01)
        return trainer.config.critic.ppo_micro_batch_size_per_gpu

    eventually(lambda: step() == 16)
    trainer.on_train_end()
    assert trainer.hook_calls[0] == "train_begin" and trainer.hook_calls[-1] == "train_end"
    assert trainer.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 32768
    report = trainer.trimtab_hook.last_report
    assert report.samples == 128 * 8 and report.phases_s["generation"] == 0.02
    assert report.phases_s["evaluation"] == pytest.approx(0.003)
    (change,) = api.get("/v1/jobs/qwen-ppo/changes").json()["changes"]
    assert change["status"] == "applied" and change["applied_step"] == trainer.global_steps + 1  # the next step
