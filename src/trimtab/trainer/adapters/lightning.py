"""PyTorch Lightning adapter: a ``Callback`` that drives the hook (``lightning.pytorch``, else
``pytorch_lightning``).

    from trimtab.trainer import attach
    from trimtab.trainer.adapters.lightning import TrimtabCallback
    hook = attach("rm-train", server="http://head:9460", device_map={"reward": [0]})
    trainer = L.Trainer(..., callbacks=[TrimtabCallback(hook)])

One report per training batch, with the batch's first dimension as its samples; it goes out when the next batch
starts (or when training ends), so a validation run after a batch — mid-epoch or at the epoch's end, the last one
included — is that step's "validation" phase. Phases: the batch (forward, backward, optimizer) is "update"; the
rest until the next batch is "other". Learning signals are read from what the module logs with ``self.log``
(``trainer.callback_metrics``) by the names in ``learning_names.toml``'s ``[user]`` table (``reward``, ``kl``,
``clip_fraction``, …). The sanity-check validation before training is no step and is not timed.
Steps count training batches (``global_step`` repeats under gradient accumulation) and continue across a resume:
the count is saved in the checkpoint (``state_dict``), else it starts from the restored ``global_step``. An
exception in training reports the last finished step and closes the hook. Lightning is imported on first use of
the class, so this module imports without it.
"""

from __future__ import annotations

from typing import Any, Optional

from trimtab.trainer.adapters.learning_names import LearningNames
from trimtab.trainer.adapters.phases import DeferredStep, PhaseSwitch, batch_len, lazy_class
from trimtab.trainer.hook import Hook


def _build() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class TrimtabCallback(Callback):
        def __init__(self, hook: Hook, samples_per_step: Optional[int] = None, close_on_train_end: bool = True):
            self.hook, self.samples_per_step, self.close_on_train_end = hook, samples_per_step, close_on_train_end
            self._phases, self._held = PhaseSwitch(hook), DeferredStep(hook)
            self._learning = LearningNames("user")
            self._next_step: Optional[int] = None  # from a checkpoint, else the restored global_step

        def state_dict(self) -> dict[str, Any]:
            return {"next_step": self._next_step or 0}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self._next_step = int(state_dict.get("next_step", 0))

        def on_train_start(self, trainer, pl_module):
            if self._next_step is None:
                self._next_step = int(trainer.global_step)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._held.flush()
            self._phases.switch("update")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._phases.switch(None)
            samples = self.samples_per_step if self.samples_per_step is not None else batch_len(batch)
            self._held.end(self._next_step, samples=samples)
            learning = self._learning.signals(trainer.callback_metrics)  # what training_step logged (self.log)
            if learning:
                self._held.log({}, learning=learning)
            self._next_step += 1

        def on_validation_start(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self._phases.switch("validation")

        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self._phases.switch(None)

        def on_train_end(self, trainer, pl_module):
            self._finish(close=self.close_on_train_end)

        def on_exception(self, trainer, pl_module, exception):
            self._finish(close=True)

        def _finish(self, close: bool) -> None:
            self._phases.switch(None)
            self._held.flush()
            if close:
                self.hook.close()

    return TrimtabCallback


__getattr__ = lazy_class(__name__, "TrimtabCallback", _build)
