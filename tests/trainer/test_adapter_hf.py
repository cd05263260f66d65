"""The Hugging Face and Lightning callbacks drive the hook from a real (tiny, CPU) training run: one report per
optimizer step / training batch, with its update time and samples, reaching the live API."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.test_hook_live import eventually, reports_of
from trimtab.trainer import attach


class TinyRegression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.lin(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def examples(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=g), "labels": torch.randn((), generator=g)} for _ in range(n)]


def test_the_hugging_face_callback_reports_every_optimizer_step(sqlite_api, tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    from transformers import Trainer, TrainingArguments

    from trimtab.trainer.adapters.hf import TrimtabCallback

    api = sqlite_api
    hook = attach("hf-sft", api.url, api.token("job"), device_map={"actor": [0]})
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    Trainer(model=TinyRegression(), args=args, train_dataset=examples(64), callbacks=[TrimtabCallback(hook)]).train()
    assert hook.closed  # the callback closed (and flushed) the hook at the end of training
    reports = eventually(lambda: len(reports_of(api, "hf-sft")) == 4 and reports_of(api, "hf-sft"))
    assert [r["step"] for r in reports] == [4, 3, 2, 1]  # state.global_step, counted from 1 as HF does
    assert all(r["samples"] == 8 and r["update_s"] > 0 and r["local_gpu"] == 0 for r in reports)


def test_the_lightning_callback_reports_every_batch_and_times_validation_as_evaluation(sqlite_api):
    L = pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    from trimtab.trainer.adapters.lightning import TrimtabCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = TinyRegression()

        def training_step(self, batch, batch_idx):
            return self.net(batch["x"], batch["labels"])["loss"]

        def validation_step(self, batch, batch_idx):
            return self.net(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    api = sqlite_api
    hook = attach("pl-rm", api.url, api.token("job"))
    loader = torch.utils.data.DataLoader(examples(48), batch_size=6)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        val_check_interval=3, limit_val_batches=2, callbacks=[TrimtabCallback(hook)])
    trainer.fit(Module(), train_dataloaders=loader, val_dataloaders=loader)
    reports = eventually(lambda: len(reports_of(api, "pl-rm")) == 6 and reports_of(api, "pl-rm"))
    by_step = {r["step"]: r for r in reports}
    assert sorted(by_step) == list(range(6)) and all(r["samples"] == 6 and r["update_s"] > 0 for r in reports)
    assert by_step[3]["evaluation_s"] > 0  # the validation run after batch 3 belongs to the next step
    assert by_step[1]["evaluation_s"] is None
