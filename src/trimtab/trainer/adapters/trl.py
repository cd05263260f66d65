"""TRL adapter (GRPOTrainer, RLOOTrainer): generation, scoring and update as separate phases, TRL's own logged
values in the step reports, and an honest advise-only job.

    from trimtab.trainer.adapters.trl import instrument
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    instrument(trainer)        # TRIMTAB_SERVER, TRIMTAB_JOB (default: the run name), TRIMTAB_TOKEN; or hook=…
    trainer.train()

TRL generates inside ``training_step`` (``_prepare_inputs`` → ``_generate_and_score_completions``), between the
``on_step_begin`` and ``on_step_end`` a plain callback sees, so ``instrument`` wraps three of the trainer's own
methods on this instance (nothing global is patched): ``_generate`` is "generation"; the rest of
``_generate_and_score_completions`` — reference and old-policy log-probs, ``_calculate_rewards`` (the reward
functions), advantages — is "evaluation" (scoring); the rest of the step (loss, backward, optimizer) is "update".
The same calls under ``trainer.evaluate()`` are "validation". TRL's profiling points mark the same calls
(``profiling_decorator`` on ``_calculate_rewards``, ``profiling_context(self, "transformers.generate")``), but
their timings reach only wandb/mlflow/trackio; ``tests/trainer/test_adapter_trl.py`` pins these seams to the
installed TRL.

With ``steps_per_generation = k`` (× ``num_iterations``) TRL generates one batch every k-th optimizer step and
trains on slices of it in between: those steps report generation 0 s and no new tokens, and step times alternate;
``trimtab check`` says so. Samples are the completions a step trains on (``completions``; ``prompts`` = that ÷
``num_generations``); tokens are what TRL's ``num_tokens`` (``state.num_input_tokens_seen``: prompt + completion
tokens generated) moved by. ``on_log`` values stay in the report's ``logged``; ``completions/mean_length`` and
``reward`` also become ``completion_mean_tokens`` and ``reward_mean``.

Knobs: none. TRL draws each generation batch (``per_device_train_batch_size × steps_per_generation``, repeated
``num_generations`` times by its sampler) from a dataloader built once; batch size, ``num_generations`` and
``steps_per_generation`` cannot change without restarting it, generation is synchronous (no prefetch depth) and
vLLM weights sync at every step (no interval). The job registers advise-only with that reason.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping, Optional

from trimtab.trainer.adapters.hf import CallbackCore
from trimtab.trainer.hook import Hook

log = logging.getLogger("trimtab.trainer")
ADVISE_ONLY = ("TRL builds its dataloader once (generation batches of per_device_train_batch_size × "
               "steps_per_generation): batch size, num_generations and steps_per_generation cannot change between "
               "steps without restarting it; generation is synchronous (no prefetch) and vLLM syncs weights every "
               "step (no interval): advise-only")
# The trainer's own methods timed, outermost first: (name, phase while training).
SEAMS = (("_generate_and_score_completions", "evaluation"), ("_generate", "generation"),
         ("_calculate_rewards", "evaluation"))
LOGGED_FIELDS = {"completions/mean_length": "completion_mean_tokens", "reward": "reward_mean"}
MEASURED = {"generation": 0.0, "evaluation": 0.0}  # timed every step: a step without generation reports 0 s, not n/a


@functools.lru_cache(maxsize=None)
def _callback_class() -> type:
    from trimtab.trainer.adapters.hf import TrimtabCallback

    class TrimtabTRLCallback(TrlCore, TrimtabCallback):
        pass

    return TrimtabTRLCallback


class TrlCore(CallbackCore):
    advise_only_reason = ADVISE_ONLY

    def __init__(self, trainer: Any, hook: Optional[Hook] = None, **options: Any):
        super().__init__(hook, **options)
        self.trainer = trainer
        self.seams: list[str] = []  # the methods wrapped on this trainer

    def wrap(self) -> None:
        trainer = self.trainer
        for name, phase in SEAMS:
            method = getattr(trainer, name, None)
            if method is None:
                log.warning("trimtab: %s has no %s (TRL %s): its time stays in 'update'", type(trainer).__name__,
                            name, _trl_version())
                continue
            if getattr(method, "__trimtab_phase__", None) is None:
                setattr(trainer, name, self._timed(method, phase))
            self.seams.append(name)

    def _timed(self, method: Callable, phase: str) -> Callable:
        @functools.wraps(method)
        def timed(*args, **kwargs):
            if not self.active:
                return method(*args, **kwargs)
            self._phases.push(phase if self.trainer.model.training else "validation")
            try:
                return method(*args, **kwargs)
            finally:
                self._phases.pop()

        timed.__trimtab_phase__ = phase
        return timed

    def _samples(self, args) -> int:
        return self._completions(args) if self.samples_per_step is None else self.samples_per_step

    def _completions(self, args) -> int:
        # GRPO's per_device_train_batch_size counts completions (num_generations of them per prompt).
        return args.per_device_train_batch_size * args.gradient_accumulation_steps

    def _extra(self, args) -> dict:
        completions = self._completions(args)
        generations = getattr(self.trainer, "num_generations", None) or 1
        return {"phases_s": dict(MEASURED),
                "framework": {"completions": completions, "prompts": completions // generations}}

    def _from_logs(self, logs: Mapping[str, Any]) -> dict:
        return {field: logs[key] for key, field in LOGGED_FIELDS.items() if key in logs}

    learning_framework = "trl"


def _trl_version() -> str:
    try:
        import trl

        return trl.__version__
    except Exception:  # only for a message
        return "?"


def instrument(trainer: Any, hook: Optional[Hook] = None, **options: Any):
    """Adds trimtab's callback to a TRL trainer and times its generation and scoring; returns the callback.
    ``hook``: an attached hook (else one is set up on the main process from ``TRIMTAB_*`` when training begins);
    ``options``: the Hugging Face callback's (``job=``, ``server=``, ``token=``, ``samples_per_step``, …)."""
    callback = _callback_class()(trainer, hook, **options)
    callback.wrap()
    trainer.add_callback(callback)
    return callback
