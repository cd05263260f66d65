"""The Lightning callback in real ``Trainer.fit`` runs (tiny model, CPU) against the live API: one report per
training batch; the sanity check is no step; validation — mid-epoch and at the end of an epoch, the last one
included — is the "validation" phase of the step it follows; the step count continues on resume; an exception
closes the hook after reporting the last finished step; what the module logs under a learning signal's name
arrives as the step's learning signal."""

from __future__ import annotations

import time

import pytest

from tests.support.frameworks import require
import torch

from tests.support.hook_api import reports_of
from tests.support.waits import eventually
from tests.trainer.tiny import TinyRegression, examples
from trimtab.trainer import attach

L = require("lightning.pytorch", reason="lightning is not installed")
from lightning.pytorch.callbacks import Callback  # noqa: E402 (the framework's own base class, checked below)
VALIDATION_S = 0.02  # each validation batch sleeps this long, so a validation run is seen where it lands


class Module(L.LightningModule):
    def __init__(self, fail_at_batch: int = -1):
        super().__init__()
        self.net, self.fail_at_batch = TinyRegression(), fail_at_batch

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at_batch:
            raise RuntimeError("the data went bad")
        return self.net(batch["x"], batch["labels"])["loss"]

    def validation_step(self, batch, batch_idx):
        time.sleep(VALIDATION_S)
        return self.net(batch["x"], batch["labels"])["loss"]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(hook, module=None, ckpt_path=None, **trainer_kw):
    from trimtab.trainer.adapters.lightning import TrimtabCallback

    loader = torch.utils.data.DataLoader(examples(24), batch_size=6)
    kw = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, limit_val_batches=2, callbacks=[TrimtabCallback(hook)])
    trainer = L.Trainer(**{**kw, **trainer_kw})
    trainer.fit(module or Module(), train_dataloaders=loader, val_dataloaders=loader, ckpt_path=ckpt_path)
    return trainer


def steps_of(api, job: str, n: int) -> dict[int, dict]:
    reports = eventually(lambda: len(reports_of(api, job)) == n and reports_of(api, job))
    return {r["step"]: r for r in reports}


def test_validation_mid_epoch_and_at_the_epochs_end_is_the_validation_of_the_step_it_follows(sqlite_api):
    api = sqlite_api
    hook = attach("pl-val", api.url, api.token("job"))
    # 4 batches an epoch, 2 epochs; validation every half epoch (after batch 2, and at the epoch's end); a 2-batch
    # sanity check first.
    fit(hook, max_epochs=2, val_check_interval=0.5, num_sanity_val_steps=2)
    assert hook.closed
    by_step = steps_of(api, "pl-val", 8)
    assert sorted(by_step) == list(range(8)) and all(r["samples"] == 6 and r["update_s"] > 0 for r in by_step.values())
    validated = {s for s, r in by_step.items() if r["validation_s"] is not None}
    assert validated == {1, 3, 5, 7}  # mid-epoch and end of epoch; step 7's, the last, is reported at train end
    assert all(by_step[s]["validation_s"] >= 2 * VALIDATION_S for s in validated)
    assert all(r["evaluation_s"] is None for r in by_step.values())  # validation is not scoring
    # The sanity check (2 batches of VALIDATION_S) is neither a step nor inside step 0.
    assert by_step[0]["validation_s"] is None and by_step[0]["step_time_s"] < 2 * VALIDATION_S


def test_the_step_count_continues_from_the_checkpoint_on_resume(sqlite_api, tmp_path):
    api = sqlite_api
    first = fit(attach("pl-resume", api.url, api.token("job")), max_steps=4, num_sanity_val_steps=0,
                limit_val_batches=0)
    first.save_checkpoint(tmp_path / "four.ckpt")
    steps_of(api, "pl-resume", 4)
    second = fit(attach("pl-resume", api.url, api.token("job")), max_steps=7, num_sanity_val_steps=0,
                 limit_val_batches=0, ckpt_path=str(tmp_path / "four.ckpt"))
    assert second.global_step == 7
    assert sorted(steps_of(api, "pl-resume", 7)) == list(range(7))  # 4, 5, 6 after 0–3: no step reported twice


def test_an_exception_in_training_reports_the_finished_steps_and_closes_the_hook(sqlite_api):
    api = sqlite_api
    hook = attach("pl-crash", api.url, api.token("job"))
    with pytest.raises(RuntimeError, match="the data went bad"):
        fit(hook, Module(fail_at_batch=2), max_steps=6, num_sanity_val_steps=0, limit_val_batches=0)
    assert hook.closed
    assert sorted(steps_of(api, "pl-crash", 2)) == [0, 1]


class LoggingModule(Module):
    """A module that logs its own learning signals with ``self.log``, as a user's RL loop in Lightning would."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("reward", -loss.detach(), on_step=True)     # trimtab's own name
        self.log("approx_kl", 0.01 * (batch_idx + 1), on_step=True)  # a common spelling, read as kl
        return loss


def test_what_the_module_logs_under_learning_names_arrives_as_the_steps_learning_signals(sqlite_api):
    api = sqlite_api
    fit(attach("pl-learn", api.url, api.token("job")), LoggingModule(), max_steps=4, num_sanity_val_steps=0,
        limit_val_batches=0)
    by_step = steps_of(api, "pl-learn", 4)
    for step, r in by_step.items():
        assert r["learning_kl"] == pytest.approx(0.01 * (step + 1)) and r["learning_reward"] < 0
        assert r["learning_clip_fraction"] is None  # not logged: absent, never 0


def test_the_callback_is_a_lightning_callback():
    from trimtab.trainer.adapters.lightning import TrimtabCallback

    assert issubclass(TrimtabCallback, Callback)  # Lightning refuses callbacks that are not its own kind
