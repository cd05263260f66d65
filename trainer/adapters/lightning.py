"""PyTorch Lightning adapter: a ``Callback`` that drives the hook (``lightning.pytorch``, else
``pytorch_lightning``).

    from trimtab.trainer import attach
    from trimtab.trainer.adapters.lightning import TrimtabCallback
    hook = attach("rm-train", server="http://head:9460", device_map={"reward": [0]})
    trainer = L.Trainer(..., callbacks=[TrimtabCallback(hook)])

Phases: a training batch (forward, backward, optimizer) is "update"; a validation run inside the epoch is
"evaluation"; the rest of the time between batches is "other". One report per training batch with the batch's
first dimension as its samples. Lightning is imported on first use of the class, so this module imports without it.
"""

from __future__ import annotations

from typing import Optional

from trimtab.trainer.adapters.phases import PhaseSwitch, batch_len, lazy_class
from trimtab.trainer.hook import Hook

def _build() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class TrimtabCallback(Callback):
        def __init__(self, hook: Hook, samples_per_step: Optional[int] = None, close_on_train_end: bool = True):
            self.hook, self.samples_per_step, self.close_on_train_end = hook, samples_per_step, close_on_train_end
            self._phases = PhaseSwitch(hook)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._phases.switch("update")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._phases.switch(None)
            samples = self.samples_per_step if self.samples_per_step is not None else batch_len(batch)
            self.hook.step_end(samples=samples)  # not global_step: it repeats under gradient accumulation

        def on_validation_start(self, trainer, pl_module):
            self._phases.switch("evaluation")

        def on_validation_end(self, trainer, pl_module):
            self._phases.switch(None)

        def on_train_end(self, trainer, pl_module):
            self._phases.switch(None)
            if self.close_on_train_end:
                self.hook.close()

    return TrimtabCallback


__getattr__ = lazy_class(__name__, "TrimtabCallback", _build)
