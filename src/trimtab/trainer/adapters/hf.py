"""Hugging Face ``transformers.Trainer`` adapter: a ``TrainerCallback`` that drives the hook.

    from trimtab.trainer.adapters.hf import TrimtabCallback
    trainer = Trainer(..., callbacks=[TrimtabCallback])   # TRIMTAB_SERVER, TRIMTAB_TOKEN, TRIMTAB_JOB (default:
                                                          # the run name, else the output directory's name)

Passed as a class, as transformers' own integrations are, it sets itself up on the main process when training
begins, from the environment, and closes its hook when training ends; ``TrimtabCallback(hook)`` or
``TrimtabCallback(server=…, job=…, token=…)`` still work. Under TRL use :mod:`trimtab.trainer.adapters.trl`.

Phases: an optimizer step (forward, backward over the accumulation micro-steps, optimizer) is "update"; what
follows it until the next step (logging, evaluation, saving, the next batches' loading) is "other" of the same
report, which goes out when the next step begins, with what ``on_log`` logged for the step (``logged``). Samples:
``per_device_train_batch_size × gradient_accumulation_steps`` unless ``samples_per_step`` says otherwise; tokens:
what ``state.num_input_tokens_seen`` moved by (``include_num_input_tokens_seen``), else ``tokens_per_step``.
Knobs: the Trainer builds its dataloader once, so no knob can change mid-run; the job is advise-only, and a knob
the hook declares without an applier of its own is refused with that reason rather than acknowledged.
``transformers`` is imported on first use of the class, so this module imports without it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

from trimtab.trainer.adapters.learning_names import LearningNames
from trimtab.trainer.adapters.phases import DeferredStep, PhaseStack, Refuse, lazy_class, lazy_hook
from trimtab.trainer.hook import Hook

log = logging.getLogger("trimtab.trainer")
ADVISE_ONLY = ("transformers' Trainer builds its dataloader once, so the batch size cannot change between steps, "
               "and it has no prefetch depth or sync interval to change: advise-only")


class CallbackCore:
    """The framework-free part of the callback (the TRL adapter extends it): lazy set-up, the held step, knobs."""

    advise_only_reason = ADVISE_ONLY

    def __init__(self, hook: Optional[Hook] = None, samples_per_step: Optional[int] = None,
                 tokens_per_step: Optional[int] = None, close_on_train_end: bool = True, *,
                 job: Optional[str] = None, server: Optional[str] = None, token: Optional[str] = None,
                 **attach_options: Any):
        self.hook, self.samples_per_step, self.tokens_per_step = hook, samples_per_step, tokens_per_step
        self._owns_hook = hook is None
        self.close_on_train_end = close_on_train_end or self._owns_hook
        self._config = dict(job=job, server=server, token=token, **attach_options)
        self._phases: Optional[PhaseStack] = None
        self._held: Optional[DeferredStep] = None
        self._tokens_seen = 0

    @property
    def active(self) -> bool:
        return self._held is not None

    def _setup(self, args, state) -> None:
        if self.active or (self.hook is None and not state.is_world_process_zero):
            return  # transformers' integrations report from the main process only
        if self.hook is None:
            cfg = dict(self._config)
            run = args.run_name or os.path.basename(str(args.output_dir or "").rstrip("/")) or "hf-train"
            self.hook = lazy_hook(cfg.pop("job"), run, cfg.pop("server"),
                                  cfg.pop("token"), advise_only_reason=self.advise_only_reason, **cfg)
        claimed = self.hook.claim_knobs(Refuse(self.advise_only_reason))
        if claimed:
            log.warning("trimtab: %s declared by the hook: every change will be refused (%s)", ", ".join(claimed),
                        self.advise_only_reason)
        self._phases, self._held = PhaseStack(self.hook), DeferredStep(self.hook)
        self._learning = LearningNames(self.learning_framework)
        self._tokens_seen = state.num_input_tokens_seen or 0

    def _begin(self) -> None:
        self._held.flush()
        self._phases.switch("update")

    def _end(self, args, state) -> None:
        self._phases.switch(None)
        seen = state.num_input_tokens_seen or 0
        tokens = seen - self._tokens_seen if seen > 0 else self.tokens_per_step  # 0 once counting: none this step
        self._tokens_seen = seen
        self._held.end(state.global_step, samples=self._samples(args), tokens=tokens, **self._extra(args))

    def _samples(self, args) -> int:
        if self.samples_per_step is not None:
            return self.samples_per_step
        return args.per_device_train_batch_size * args.gradient_accumulation_steps

    def _extra(self, args) -> dict:
        """More ``hook.step_end`` arguments for the step (the TRL adapter's phases and counts)."""
        return {}

    def _from_logs(self, logs: Mapping[str, Any]) -> dict:
        """Report fields taken from the framework's logs (the TRL adapter maps its names)."""
        return {}

    learning_framework = "user"  # whose names the learning signals are read by (learning_names.toml)

    def _log(self, state, logs) -> None:
        if self.active and logs and self._held.step == state.global_step:
            self._held.log(logs, learning=self._learning.signals(logs), **self._from_logs(logs))

    def _finish(self) -> None:
        if self.active:
            self._phases.switch(None)
            self._held.flush()
        if self.hook is not None and self.close_on_train_end:
            self.hook.close()


def _build() -> type:
    from transformers import TrainerCallback

    class TrimtabCallback(CallbackCore, TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self._setup(args, state)
            if self.active and type(args).__module__.startswith("trl.") and type(self).__name__ == "TrimtabCallback":
                log.warning("trimtab: a TRL trainer: trimtab.trainer.adapters.trl.instrument(trainer) times its "
                            "generation and scoring; this callback sees one 'update' phase")

        def on_step_begin(self, args, state, control, **kwargs):
            if self.active:
                self._begin()

        def on_step_end(self, args, state, control, **kwargs):
            if self.active:
                self._end(args, state)

        def on_log(self, args, state, control, logs=None, **kwargs):
            self._log(state, logs)

        def on_train_end(self, args, state, control, **kwargs):
            self._finish()

    return TrimtabCallback


__getattr__ = lazy_class(__name__, "TrimtabCallback", _build)
