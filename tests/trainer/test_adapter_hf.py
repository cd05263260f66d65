"""The Hugging Face callback in real (tiny, CPU) ``Trainer.train`` runs against the live API: passed as a class it
sets itself up from TRIMTAB_* on the main process and names the job after the run; one report per optimizer step
with its update time, samples and what ``on_log`` logged; a knob the Trainer cannot change is refused with the
reason, never acknowledged."""

from __future__ import annotations

import time

from tests.support.frameworks import require
from tests.support.hook_api import reports_of
from tests.support.waits import eventually
from tests.trainer.tiny import TinyRegression, examples
from trimtab.trainer import attach

require("transformers", reason="transformers is not installed")
require("accelerate", reason="transformers' Trainer needs accelerate")
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments  # noqa: E402

from trimtab.trainer.adapters.hf import ADVISE_ONLY, TrimtabCallback  # noqa: E402


def train(tmp_path, callbacks, max_steps=4, **kw):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0, **kw)
    trainer = Trainer(model=TinyRegression(), args=args, train_dataset=examples(64), callbacks=callbacks)
    cb = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TrimtabCallback))
    assert cb.hook is None or cb.hook.step == 0  # nothing set up before training begins
    trainer.train()
    return cb


def test_passed_as_a_class_it_sets_up_from_the_environment_and_names_the_job_after_the_run(sqlite_api, tmp_path,
                                                                                          monkeypatch):
    api = sqlite_api
    monkeypatch.setenv("TRIMTAB_SERVER", api.url)
    monkeypatch.setenv("TRIMTAB_TOKEN", api.token("job"))
    monkeypatch.delenv("TRIMTAB_JOB", raising=False)
    cb = train(tmp_path, [TrimtabCallback], run_name="sft run/3", logging_steps=2)
    assert cb.hook.job == "sft-run-3" and cb.hook.closed  # the run name as a slug; closed at train end
    reports = eventually(lambda: len(reports_of(api, "sft-run-3")) == 4 and reports_of(api, "sft-run-3"))
    by_step = {r["step"]: r for r in reports}
    assert sorted(by_step) == [1, 2, 3, 4]  # state.global_step, counted from 1 as HF does
    assert all(r["samples"] == 8 and r["update_s"] > 0 for r in reports)
    # on_log comes after on_step_end: the report waits for it (logging_steps=2: steps 2 and 4 logged their loss).
    assert {s for s, r in by_step.items() if r["logged"] and "loss" in r["logged"]} == {2, 4}
    job = api.get("/v1/jobs/sft-run-3").json()
    assert job["knobs"] == {} and job["advise_only_reason"] == ADVISE_ONLY


def test_trimtab_job_names_the_job_and_explicit_arguments_win_over_the_environment(sqlite_api, tmp_path, monkeypatch):
    api = sqlite_api
    monkeypatch.setenv("TRIMTAB_SERVER", "http://127.0.0.1:9")  # nothing listens there: the argument must win
    monkeypatch.setenv("TRIMTAB_JOB", "from-env")
    cb = train(tmp_path, [TrimtabCallback(server=api.url, token=api.token("job"))], max_steps=2)
    assert cb.hook.job == "from-env"
    assert eventually(lambda: len(reports_of(api, "from-env")) == 2)


def test_only_the_main_process_sets_up_a_hook(tmp_path, monkeypatch):
    monkeypatch.delenv("TRIMTAB_SERVER", raising=False)
    cb = TrimtabCallback()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    cb.on_train_begin(args, TrainerState(is_world_process_zero=False), TrainerControl())
    assert cb.hook is None and not cb.active
    cb.on_train_begin(args, TrainerState(is_world_process_zero=True), TrainerControl())
    assert cb.hook is not None and cb.hook.job == tmp_path.name  # no run name: the output directory's name
    cb.on_train_end(args, TrainerState(), TrainerControl())
    assert cb.hook.closed


class WaitForReplies(TrainerCallback):
    """Each step starts once the server answered the previous step's report (the change rides on that answer),
    so the change reaches a boundary inside this short run."""

    def __init__(self, hook):
        self.hook = hook

    def on_step_begin(self, args, state, control, **kwargs):
        deadline = time.monotonic() + 5
        while self.hook.stats["sent"] < state.global_step - 1 and time.monotonic() < deadline:
            time.sleep(0.01)


def test_a_batch_size_the_trainer_cannot_change_is_refused_with_the_reason_not_acknowledged(sqlite_api, tmp_path):
    api = sqlite_api
    hook = attach("hf-knob", api.url, api.token("job"), knobs={"batch_size": (4, 1, 16)})
    eventually(lambda: api.get("/v1/jobs/hf-knob").status_code == 200)
    r = api.post("/v1/jobs/hf-knob/changes", {"knob": "batch_size", "value": 8}, scope="admin")
    assert r.status_code == 201, r.text
    cid = r.json()["change_id"]
    train(tmp_path, [TrimtabCallback(hook), WaitForReplies(hook)], max_steps=5)

    def change():
        c = next(c for c in api.get("/v1/jobs/hf-knob/changes").json()["changes"] if c["change_id"] == cid)
        return c["status"] == "refused" and c

    refused = eventually(change)
    assert refused["acks"] == [] and ADVISE_ONLY in refused["refused_reason"]
    assert hook.knobs["batch_size"] == 4
    assert api.get("/v1/jobs/hf-knob").json()["knobs"]["batch_size"]["value"] == 4
