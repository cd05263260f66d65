"""Hugging Face ``transformers.Trainer`` adapter: a ``TrainerCallback`` that drives the hook.

    from trimtab.trainer import attach
    from trimtab.trainer.adapters.hf import TrimtabCallback
    hook = attach("sft-7b", server="http://head:9460", device_map={"actor": [0, 1]})
    trainer = Trainer(..., callbacks=[TrimtabCallback(hook)])

Phases: an optimizer step (forward, backward over the accumulation micro-steps, optimizer) is "update"; the
time between steps (data loading, logging, evaluation) lands in "other". One report per optimizer step, with
``per_device_train_batch_size × gradient_accumulation_steps`` samples unless ``samples_per_step`` says otherwise.
HF's Trainer builds its dataloader once, so batch size cannot change mid-run: read ``hook.knobs`` in your own
code (e.g. a TRL generation batch) where it can. ``transformers`` is imported on first use of the class, so this
module imports without it.
"""

from __future__ import annotations

from typing import Optional

from trimtab.trainer.adapters.phases import PhaseSwitch, lazy_class
from trimtab.trainer.hook import Hook

def _build() -> type:
    from transformers import TrainerCallback

    class TrimtabCallback(TrainerCallback):
        def __init__(self, hook: Hook, samples_per_step: Optional[int] = None,
                     tokens_per_step: Optional[int] = None, close_on_train_end: bool = True):
            self.hook, self.samples_per_step, self.tokens_per_step = hook, samples_per_step, tokens_per_step
            self.close_on_train_end = close_on_train_end
            self._phases = PhaseSwitch(hook)

        def on_step_begin(self, args, state, control, **kwargs):
            self._phases.switch("update")

        def on_step_end(self, args, state, control, **kwargs):
            self._phases.switch(None)
            samples = self.samples_per_step
            if samples is None:
                samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
            self.hook.step_end(samples=samples, tokens=self.tokens_per_step, step=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            self._phases.switch(None)
            if self.close_on_train_end:
                self.hook.close()

    return TrimtabCallback


__getattr__ = lazy_class(__name__, "TrimtabCallback", _build)
